package runcontext

import (
	"encoding/json"

	"github.com/invopop/jsonschema"
)

// Schema returns the JSON Schema of a RunContext, indented.
func Schema() []byte {
	r := jsonschema.Reflector{RequiredFromJSONSchemaTags: false, DoNotReference: false}
	s := r.Reflect(&RunContext{})
	s.ID = "https://github.com/ctxd/ctxd/runcontext.schema.json"
	s.Title = "ctxd RunContext"
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		panic("runcontext: schema does not marshal: " + err.Error()) // static types: cannot happen
	}
	return append(b, '\n')
}
