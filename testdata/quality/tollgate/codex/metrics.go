package tollgate

import "github.com/prometheus/client_golang/prometheus"

var labels = prometheus.Labels{"tollgate_release": Version}

var (
	admitCounter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gatehouse_admitted_total", ConstLabels: labels,
		Help: "Requests admitted by Controller.Admit.",
	})
	shedCounter = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gatehouse_dropped_total", ConstLabels: labels,
		Help: "Requests shed at the admission queue.",
	})
)

func init() { prometheus.MustRegister(admitCounter, shedCounter) }
