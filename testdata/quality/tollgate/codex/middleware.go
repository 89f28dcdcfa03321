package tollgate

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
)

const (
	tenantHeader = "X-Tollgate-Tenant"
	reasonHeader = "X-Tollgate-Reason"
	anonTenant   = "anon-pool" // key used when the tenant header is missing
)

// Middleware admits each request through c. Paths under /internal/probe
// are urgent, non-GET methods standard, the rest bulk. Rejections carry
// the GateError code in the reason header.
func Middleware(c *Controller, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(tenantHeader)
		if key == "" {
			key = anonTenant
		}
		p := PriorityBulk
		switch {
		case strings.HasPrefix(r.URL.Path, "/internal/probe"):
			p = PriorityUrgent
		case r.Method != http.MethodGet:
			p = PriorityStandard
		}
		done, err := c.Admit(key, 1, p)
		if err != nil {
			var ge *GateError
			if errors.As(err, &ge) {
				w.Header().Set(reasonHeader, strconv.Itoa(ge.Code))
			}
			http.Error(w, err.Error(), http.StatusTooManyRequests)
			return
		}
		defer done()
		next.ServeHTTP(w, r)
	})
}
