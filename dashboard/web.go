package dashboard

import (
	"embed"
	"io/fs"
)

// web is the page: index.html, its module and style, and the vendored
// uPlot (web/vendor, pinned in package-lock.json; `make dashboard-vendor`
// copies it from node_modules).
//
//go:embed web/index.html web/app.js web/style.css web/vendor
var web embed.FS

// Page is the page's files, index.html at the root.
func Page() fs.FS {
	sub, err := fs.Sub(web, "web")
	if err != nil {
		panic(err) // the embedded tree always has web/
	}
	return sub
}
