package idem

// DecodeUTF8 is decodeUTF8, for tests of package idem_test.
var DecodeUTF8 = decodeUTF8
