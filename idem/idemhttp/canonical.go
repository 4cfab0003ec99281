package idemhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// maxCanonicalDepth bounds the nesting CanonicalJSON walks; a deeper body
// is fingerprinted raw.
const maxCanonicalDepth = 256

// CanonicalJSON returns an Options.Fingerprint that fingerprints a JSON body
// by its content rather than its bytes, without the members named by ignore
// (fields that change between retries of one request: a timestamp, a
// rotated credential). Each of ignore is a JSON Pointer (RFC 6901,
// "/auth/token"; through objects and array indexes) or a top-level member's
// name ("timestamp").
//
// The canonical form has no insignificant white space, each object's
// members sorted by name (byte order of their UTF-8), strings as
// encoding/json reads and re-encodes them, and numbers exactly as written
// (1.0 and 1 differ). A body that is not one JSON value (invalid, with
// trailing data, an object with a repeated name, nested deeper than 256) is
// fingerprinted as its raw bytes, which no canonical form equals, so the
// handler answers it as it would without the option.
func CanonicalJSON(ignore ...string) func(r *http.Request, body []byte) []byte {
	skip := make(map[string]bool, len(ignore))
	for _, p := range ignore {
		if !strings.HasPrefix(p, "/") {
			p = "/" + pointerEscaper.Replace(p)
		}
		skip[p] = true
	}
	return func(_ *http.Request, body []byte) []byte {
		d := json.NewDecoder(bytes.NewReader(body))
		d.UseNumber()
		var out bytes.Buffer
		if err := canonicalValue(d, &out, "", skip, 0); err != nil {
			return body
		}
		if _, err := d.Token(); err != io.EOF {
			return body
		}
		return out.Bytes()
	}
}

var errNotCanonical = errors.New("not one JSON value")

// pointerEscaper escapes a member's name as a JSON Pointer's reference token.
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// canonicalValue writes the canonical form of d's next value, at JSON
// Pointer ptr, to out.
func canonicalValue(d *json.Decoder, out *bytes.Buffer, ptr string, skip map[string]bool, depth int) error {
	tok, err := d.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxCanonicalDepth || t != '{' && t != '[' {
			return errNotCanonical
		}
		if t == '[' {
			out.WriteByte('[')
			for i := 0; d.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := canonicalValue(d, out, ptr+"/"+strconv.Itoa(i), skip, depth+1); err != nil {
					return err
				}
			}
			_, err := d.Token() // ]
			out.WriteByte(']')
			return err
		}
		return canonicalObject(d, out, ptr, skip, depth)
	case string:
		writeJSONString(out, t)
	case json.Number:
		out.WriteString(string(t))
	case bool:
		out.WriteString(strconv.FormatBool(t))
	case nil:
		out.WriteString("null")
	}
	return nil
}

// canonicalObject writes the rest of an object, its members sorted.
func canonicalObject(d *json.Decoder, out *bytes.Buffer, ptr string, skip map[string]bool, depth int) error {
	members := map[string][]byte{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		if _, dup := members[name]; dup {
			return errNotCanonical
		}
		var v bytes.Buffer
		child := ptr + "/" + pointerEscaper.Replace(name)
		if err := canonicalValue(d, &v, child, skip, depth+1); err != nil {
			return err
		}
		members[name] = nil // ignored, it still counts as a name seen
		if !skip[child] {
			members[name] = v.Bytes()
		}
	}
	if _, err := d.Token(); err != nil { // }
		return err
	}
	out.WriteByte('{')
	first := true
	for _, name := range slices.Sorted(maps.Keys(members)) {
		if members[name] == nil {
			continue
		}
		if !first {
			out.WriteByte(',')
		}
		first = false
		writeJSONString(out, name)
		out.WriteByte(':')
		out.Write(members[name])
	}
	out.WriteByte('}')
	return nil
}

// writeJSONString writes s as a JSON string, without HTML escaping.
func writeJSONString(out *bytes.Buffer, s string) {
	e := json.NewEncoder(out)
	e.SetEscapeHTML(false)
	_ = e.Encode(s)             // a string always encodes
	out.Truncate(out.Len() - 1) // Encode's newline
}
