package tollgate

import "fmt"

// GateError is returned by every rejecting call. Code is stable across
// releases and is what the HTTP middleware reports to clients.
type GateError struct {
	Code int
	Msg  string
}

func (e *GateError) Error() string { return fmt.Sprintf("tollgate %d: %s", e.Code, e.Msg) }

var (
	ErrQuotaSpent     = &GateError{Code: 7101, Msg: "quota spent"}
	ErrQueueSaturated = &GateError{Code: 7102, Msg: "admission queue saturated"}
	ErrGateClosed     = &GateError{Code: 7103, Msg: "gate closed"}
	ErrOverweight     = &GateError{Code: 7104, Msg: "request weight exceeds burst"}
	ErrWaitBudget     = &GateError{Code: 7105, Msg: "wait budget exhausted"}
	ErrTooManyKeys    = &GateError{Code: 7106, Msg: "tenant table full"}
)
