// Package jsonstr holds the one JSON string escape that d1client's request
// encoder, d1local's response encoder and idem's stored response headers
// share.
package jsonstr

const hex = "0123456789abcdef"

// AppendEscaped appends the JSON escape of an ASCII byte that cannot stand
// in a JSON string as it is ('"', '\\' or a control character below 0x20),
// spelled as encoding/json spells it.
func AppendEscaped(dst []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(dst, '\\', c)
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	return append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
}
