package idem

// DecodeUTF8 is decodeUTF8, for tests of package idem_test.
var DecodeUTF8 = decodeUTF8

// CacheLen returns the entries of l's replay cache and the bytes they count for.
func CacheLen(l *Ledger) (int, int) { return l.cache.len() }
