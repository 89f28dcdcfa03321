package tollgate

import "sync/atomic"

// Priority orders requests at the admission queue.
type Priority int

const (
	PriorityBulk Priority = iota
	PriorityStandard
	PriorityUrgent
)

// Controller bounds the requests in flight in front of a Limiter.
type Controller struct {
	lim      *Limiter
	inFlight atomic.Int64
}

// Admit takes a queue slot and tokens for one request. While occupancy
// (in flight / cfg.QueueDepth) is above cfg.ShedThreshold, bulk requests
// are shed; past full depth all but urgent ones are. Shed requests get
// ErrQueueSaturated. Call the returned func when the request is done.
func (c *Controller) Admit(key string, weight int, p Priority) (func(), error) {
	cfg := &c.lim.cfg
	occ := float64(c.inFlight.Add(1)) / float64(cfg.QueueDepth)
	if (p == PriorityBulk && occ > cfg.ShedThreshold) || (p != PriorityUrgent && occ > 1) {
		c.inFlight.Add(-1)
		shedCounter.Inc()
		return nil, ErrQueueSaturated
	}
	if err := c.lim.Acquire(key, weight, p == PriorityUrgent); err != nil {
		c.inFlight.Add(-1)
		return nil, err
	}
	admitCounter.Inc()
	return func() { c.inFlight.Add(-1) }, nil
}
