// Package config is the daemon's configuration: one struct with defaults,
// loaded from TOML, validated field by field. Unknown keys are errors.
//
// Nothing here reads the environment: main passes in what it needs
// (the user id, XDG directories) so the defaults are testable.
package config
