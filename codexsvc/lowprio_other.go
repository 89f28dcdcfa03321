//go:build !linux

package codexsvc

// lowPriority does nothing on this system: the background count runs at
// the daemon's priority.
func lowPriority() {}
