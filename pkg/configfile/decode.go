package configfile

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// Decode runs data, a YAML or JSON document, through the pipeline the
// package documentation describes, into obj: a pointer to a struct that
// embeds TypeMeta. kind is the kind the caller reads. It returns Problems
// for anything wrong with the document's content, or a plain error when
// data is not YAML or JSON at all.
func Decode(data []byte, kind string, obj Object) error {
	t := reflect.TypeOf(obj)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("configfile: Decode needs a pointer to a struct, not %T", obj)
	}
	doc, err := parse(data)
	if err != nil {
		return err
	}
	if errs := checkTypeMeta(doc, kind); len(errs) > 0 {
		return Problems(errs)
	}
	if errs := check(doc, t.Elem(), nil); len(errs) > 0 {
		return Problems(errs)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		// check found nothing, so the decoder has a rule check lacks: say
		// what the decoder says rather than lose the problem.
		return cleanError(err)
	}
	// The document as written, without defaults, for the explicit zeros.
	raw := reflect.New(t.Elem())
	if err := yaml.Unmarshal(data, raw.Interface()); err != nil {
		return cleanError(err)
	}
	obj.Default()
	errs := explicitZeros(doc, raw.Elem(), reflect.ValueOf(obj).Elem(), nil)
	errs = append(errs, obj.Validate()...)
	return Join(errs)
}

// parse reads the document as an ordered tree: mappings are
// yamlv2.MapSlice (so problems are reported in the order of the file),
// lists []any, scalars what YAML makes of them.
func parse(data []byte) (yamlv2.MapSlice, error) {
	var doc yamlv2.MapSlice
	if err := yamlv2.Unmarshal(data, &doc); err != nil {
		var te *yamlv2.TypeError
		if errors.As(err, &te) {
			return nil, errors.New("not a configuration file: the document must be a mapping of fields, starting with apiVersion and kind")
		}
		return nil, fmt.Errorf("not valid YAML or JSON: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return doc, nil
}

// checkTypeMeta reports a missing or wrong apiVersion or kind, the same
// way for every file type.
func checkTypeMeta(doc yamlv2.MapSlice, kind string) field.ErrorList {
	var errs field.ErrorList
	for _, want := range []struct{ name, value string }{{"apiVersion", APIVersion}, {"kind", kind}} {
		p := field.NewPath(want.name)
		got, found, other := lookup(doc, want.name)
		switch {
		case !found && other != "":
			errs = append(errs, field.Required(p, fmt.Sprintf("set %s: %s (found %q: field names are case-sensitive)", want.name, want.value, other)))
		case !found || got == nil || got == "":
			errs = append(errs, field.Required(p, fmt.Sprintf("set %s: %s", want.name, want.value)))
		case fmt.Sprint(got) != want.value:
			errs = append(errs, field.NotSupported(p, fmt.Sprint(got), []string{want.value}))
		}
	}
	return errs
}

// lookup returns the value of key in doc, and when key is absent a key that
// differs from it only in case.
func lookup(doc yamlv2.MapSlice, key string) (value any, found bool, other string) {
	for _, item := range doc {
		k := keyString(item.Key)
		if k == key {
			return item.Value, true, ""
		}
		if strings.EqualFold(k, key) {
			other = k
		}
	}
	return nil, false, other
}

// check compares the document's tree with the Go type it decodes into and
// reports every unknown or repeated field and every value of the wrong type.
func check(node any, t reflect.Type, p *field.Path) field.ErrorList {
	if node == nil {
		return nil // null: the field stays unset
	}
	if isLeaf(t) {
		return checkLeaf(node, t, p)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return check(node, t.Elem(), p)
	case reflect.Interface:
		return nil
	case reflect.Struct:
		ms, ok := node.(yamlv2.MapSlice)
		if !ok {
			return field.ErrorList{wrongShape(p, node, "a mapping of fields (name: value)")}
		}
		fields := fieldsOf(t)
		var errs field.ErrorList
		seen := map[string]bool{}
		for _, item := range ms {
			key := keyString(item.Key)
			fp := p.Child(key)
			if seen[key] {
				errs = append(errs, repeated(fp))
				continue
			}
			seen[key] = true
			f, ok := fields.byName(key)
			if !ok {
				errs = append(errs, unknownField(fp, key, fields))
				continue
			}
			errs = append(errs, check(item.Value, f.typ, fp)...)
		}
		return errs
	case reflect.Slice, reflect.Array:
		list, ok := node.([]any)
		if !ok {
			want := "a list"
			if !isCollection(node) {
				want = fmt.Sprintf("a list, e.g. [%v]", node)
			}
			return field.ErrorList{wrongShape(p, node, want)}
		}
		var errs field.ErrorList
		for i, v := range list {
			errs = append(errs, check(v, t.Elem(), p.Index(i))...)
		}
		return errs
	case reflect.Map:
		ms, ok := node.(yamlv2.MapSlice)
		if !ok {
			return field.ErrorList{wrongShape(p, node, "a mapping (key: value)")}
		}
		var errs field.ErrorList
		seen := map[string]bool{}
		for _, item := range ms {
			key := keyString(item.Key)
			kp := p.Key(key)
			if seen[key] {
				errs = append(errs, repeated(kp))
				continue
			}
			seen[key] = true
			errs = append(errs, check(item.Value, t.Elem(), kp)...)
		}
		return errs
	}
	return checkLeaf(node, t, p)
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// isLeaf reports whether t decodes itself or is a scalar: its values are
// checked by decoding them, not walked.
func isLeaf(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		return true
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Interface:
		return false
	case reflect.Slice, reflect.Array:
		return t.Elem().Kind() == reflect.Uint8 // base64 bytes
	}
	return true
}

// checkLeaf decodes node into a new t the way the whole document is
// decoded, and turns a failure into a problem at p.
func checkLeaf(node any, t reflect.Type, p *field.Path) field.ErrorList {
	b, err := yamlv2.Marshal(node)
	if err != nil {
		return field.ErrorList{field.Invalid(p, display(node), err.Error())}
	}
	err = yaml.UnmarshalStrict(b, reflect.New(t).Interface())
	if err == nil {
		return nil
	}
	base := t
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	if reflect.PointerTo(base).Implements(jsonUnmarshaler) || reflect.PointerTo(base).Implements(textUnmarshaler) {
		return field.ErrorList{field.Invalid(p, display(node), cleanError(err).Error())}
	}
	want := "a value of type " + base.String()
	switch base.Kind() {
	case reflect.Bool:
		want = "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		want = "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	case reflect.String:
		want = "a string"
	}
	return field.ErrorList{wrongShape(p, node, want)}
}

// wrongShape reports a value of the wrong type.
func wrongShape(p *field.Path, node any, want string) *field.Error {
	return field.Invalid(p, display(node), fmt.Sprintf("must be %s, not %s", want, describe(node)))
}

func repeated(p *field.Path) *field.Error {
	return &field.Error{Type: field.ErrorTypeDuplicate, Field: p.String(), BadValue: field.OmitValueType{}, Detail: "given more than once; keep one"}
}

// unknownField reports a field name the type does not have, with the
// closest one it has.
func unknownField(p *field.Path, key string, fields fieldList) *field.Error {
	names := fields.names()
	detail := "unknown field; known fields: " + strings.Join(names, ", ")
	if s, ok := suggest(key, names); ok {
		detail = fmt.Sprintf("unknown field; did you mean %q?", s)
		if strings.EqualFold(s, key) {
			detail += " (field names are case-sensitive)"
		}
	}
	return &field.Error{Type: field.ErrorTypeNotFound, Field: p.String(), BadValue: field.OmitValueType{}, Detail: detail}
}

// suggest returns the known name closest to key: one equal but for case
// first, else the one fewest edits away, when few enough edits for a typo.
func suggest(key string, known []string) (string, bool) {
	// Distances are between lower-cased names, so a name equal but for case
	// is 0 edits away and comes first.
	best, bestD := "", -1
	lk := strings.ToLower(key)
	for _, k := range known {
		d := editDistance(lk, strings.ToLower(k))
		if bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	if bestD < 0 || bestD > max(1, len(key)/3) {
		return "", false
	}
	return best, true
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// explicitZeros reports every field the document sets to its zero value
// ("count: 0", `idPattern: ""`, "rescanInterval: 0s", "[]") that Default
// replaces: writing the zero cannot mean the default, so the author meant
// something the file does not say. raw is the document decoded without
// defaults, def the same after Default.
func explicitZeros(node any, raw, def reflect.Value, p *field.Path) field.ErrorList {
	if node == nil || !raw.IsValid() || !def.IsValid() {
		return nil
	}
	for raw.Kind() == reflect.Pointer {
		if raw.IsNil() || def.IsNil() {
			return nil
		}
		raw, def = raw.Elem(), def.Elem()
	}
	if isLeaf(raw.Type()) {
		if raw.IsZero() && !def.IsZero() {
			return field.ErrorList{zeroProblem(p, raw, def)}
		}
		return nil
	}
	var errs field.ErrorList
	switch raw.Kind() {
	case reflect.Struct:
		ms, _ := node.(yamlv2.MapSlice)
		fields := fieldsOf(raw.Type())
		for _, item := range ms {
			key := keyString(item.Key)
			f, ok := fields.byName(key)
			if !ok {
				continue
			}
			rv, err1 := raw.FieldByIndexErr(f.index)
			dv, err2 := def.FieldByIndexErr(f.index)
			if err1 != nil || err2 != nil {
				continue
			}
			errs = append(errs, explicitZeros(item.Value, rv, dv, p.Child(key))...)
		}
	case reflect.Slice:
		list, _ := node.([]any)
		if len(list) == 0 && raw.Len() == 0 && def.Len() > 0 {
			return field.ErrorList{zeroProblem(p, raw, def)}
		}
		for i, v := range list {
			if i < raw.Len() && i < def.Len() {
				errs = append(errs, explicitZeros(v, raw.Index(i), def.Index(i), p.Index(i))...)
			}
		}
	case reflect.Map:
		ms, _ := node.(yamlv2.MapSlice)
		if len(ms) == 0 && raw.Len() == 0 && def.Len() > 0 {
			return field.ErrorList{zeroProblem(p, raw, def)}
		}
		if raw.Type().Key().Kind() != reflect.String {
			return nil
		}
		for _, item := range ms {
			key := keyString(item.Key)
			k := reflect.ValueOf(key).Convert(raw.Type().Key())
			errs = append(errs, explicitZeros(item.Value, raw.MapIndex(k), def.MapIndex(k), p.Key(key))...)
		}
	}
	return errs
}

func zeroProblem(p *field.Path, raw, def reflect.Value) *field.Error {
	d, err := json.Marshal(def.Interface())
	if err != nil {
		d = []byte(fmt.Sprint(def.Interface()))
	}
	return field.Invalid(p, raw.Interface(), "an explicit zero is not a setting here; leave the field out for the default, "+string(d))
}

// field is one JSON field of a struct, embedded structs' fields promoted.
type fieldInfo struct {
	name  string
	typ   reflect.Type
	index []int
}

type fieldList []fieldInfo

func (l fieldList) byName(name string) (fieldInfo, bool) {
	for _, f := range l {
		if f.name == name {
			return f, true
		}
	}
	return fieldInfo{}, false
}

func (l fieldList) names() []string {
	out := make([]string, len(l))
	for i, f := range l {
		out[i] = f.name
	}
	return out
}

// fieldsOf lists the fields encoding/json decodes into t, in declaration
// order.
func fieldsOf(t reflect.Type) fieldList {
	var out fieldList
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if sf.Anonymous && name == "" {
			ft := sf.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for _, f := range fieldsOf(ft) {
					f.index = append([]int{i}, f.index...)
					out = append(out, f)
				}
				continue
			}
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		out = append(out, fieldInfo{name: name, typ: sf.Type, index: []int{i}})
	}
	return out
}

// keyString writes a mapping key the way sigs.k8s.io/yaml turns it into a
// JSON field name.
func keyString(k any) string {
	switch k := k.(type) {
	case string:
		return k
	case float64:
		return strconv.FormatFloat(k, 'g', -1, 32)
	}
	return fmt.Sprint(k)
}

// display is the value a problem shows: scalars as they are, collections
// not at all.
func display(node any) any {
	if isCollection(node) {
		return field.OmitValueType{}
	}
	return node
}

func isCollection(node any) bool {
	switch node.(type) {
	case yamlv2.MapSlice, []any:
		return true
	}
	return false
}

// describe names the kind of YAML value node is.
func describe(node any) string {
	switch node.(type) {
	case yamlv2.MapSlice:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int, int64, uint64:
		return "a whole number"
	case float64:
		return "a number"
	}
	return fmt.Sprintf("%T", node)
}

// cleanError drops the decoder's layered prefixes so the message starts
// with what is wrong, e.g. `error unmarshaling JSON: while decoding JSON:
// json: unknown field "cout"` becomes `unknown field "cout"`.
func cleanError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "json: ", "yaml: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	return errors.New(msg)
}
