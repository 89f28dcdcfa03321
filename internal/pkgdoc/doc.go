// Package pkgdoc holds a repository-wide check: every Go package of ctxd
// carries a package doc comment saying what it is for. It has no code.
package pkgdoc
