// Package sigils resolves the sigil an agent presents to its identity and
// permission scopes. Scopes decide which tools a request is offered.
//
// Sigils are configured by the operator; an unknown sigil is refused, never
// mapped to a default silently.
package sigils
