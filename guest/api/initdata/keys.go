package initdata

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// exactKeys refuses a key of the TOML document data that names a field of
// v's type in another case ("Data", "ALLOW_EXEC"). go-toml matches keys
// to fields without regard to case, the last one winning, while CoCo's
// parsers (serde, in Rust) and any reader that looks the key up as
// written take the one spelled as the specification spells it: a
// document with both would mean one thing to a reviewer or a relying
// party that judges its content, and another to the agent. Keys of
// tables that are maps (a policy's containers, a CoCo document's data)
// are names, not fields: any spelling is kept as written.
func exactKeys(data []byte, v any) error {
	var raw map[string]any
	if err := toml.Unmarshal(data, &raw); err != nil {
		return err
	}
	return exactIn(raw, reflect.TypeOf(v), nil)
}

func exactIn(val any, t reflect.Type, at []string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		table, ok := val.(map[string]any)
		if !ok {
			return nil // a scalar the type reads itself (TextUnmarshaler)
		}
		fields := tomlFields(t)
		for _, k := range slices.Sorted(maps.Keys(table)) {
			f, exact := fields[k]
			if !exact {
				for name := range fields {
					// go-toml's own rule (ToLower: "İ" is "i" to it) and
					// Unicode's simple folding (the Kelvin sign is "k").
					//lint:ignore SA6005 go-toml matches by ToLower, which EqualFold does not cover ("İ")
					if strings.ToLower(name) == strings.ToLower(k) || strings.EqualFold(name, k) {
						return fmt.Errorf("key %q: keys are case-sensitive, write %q", strings.Join(append(at, k), "."), strings.Join(append(at, name), "."))
					}
				}
				continue // unknown: the decoder's to refuse, or not
			}
			if err := exactIn(table[k], f.Type, append(at, k)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if table, ok := val.(map[string]any); ok {
			for _, k := range slices.Sorted(maps.Keys(table)) {
				if err := exactIn(table[k], t.Elem(), append(at, k)); err != nil {
					return err
				}
			}
		}
	case reflect.Slice, reflect.Array:
		if list, ok := val.([]any); ok {
			for i, sub := range list {
				if err := exactIn(sub, t.Elem(), append(at, fmt.Sprintf("%d", i))); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// tomlFields are t's fields by the key go-toml reads each from: its tag's
// name, else its Go name; an embedded struct without a tag contributes
// its own fields.
func tomlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if tag == "-" {
			continue
		}
		if f.Anonymous && tag == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, g := range tomlFields(ft) {
					out[k] = g
				}
				continue
			}
		}
		if tag == "" {
			tag = f.Name
		}
		out[tag] = f
	}
	return out
}
