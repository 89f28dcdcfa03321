// Package persona serves several personas — each a model, a window, an
// identity and a codex of its own — from one daemon under one memory
// budget. A persona is loaded on its first request; when another must load
// and the budget is short, the persona idle longest is evacuated (its warm
// slots saved to disk, its model server stopped) and restored on its next
// request. Pinned personas are never evacuated, a persona in use never is,
// and a persona that cannot fit even alone is refused with the numbers.
package persona
