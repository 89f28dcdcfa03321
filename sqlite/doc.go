// Package sqlite is ctxd's durable store: sessions and their turns, and
// the karma record (traces, their events, the karma each session was
// shown), kept in one embedded SQLite database (the pure-Go
// modernc.org/sqlite driver) so a restarted daemon continues every
// conversation where it stopped.
//
// It stores what was said, not what it rendered to: rendering stays in
// package runcontext.
package sqlite
