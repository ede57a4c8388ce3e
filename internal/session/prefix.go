package session

// ScanEnvelopePrefix reads the envelope from the beginning of a line too large to hold in
// memory (a multi-MB image or tool output): the top-level keys whose values lie wholly in
// prefix. Pi writes type, id, parentId and timestamp before the payload, so a few KiB
// suffice. It reports false when prefix does not start a JSON object with a string
// "type" before the first value it cannot finish. Unlike ScanEntry it cannot tell whether
// the rest of the line is valid JSON: callers keep such a line's bytes whatever they are.
func ScanEnvelopePrefix(prefix []byte) (Envelope, bool) {
	var f [numKeys]field
	b := prefix
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return Envelope{}, false
	}
	i = skipWS(b, i+1)
	for i < len(b) && b[i] == '"' {
		var err error
		if i, err = scanMember(b, i, &f); err != nil {
			break
		}
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ',' {
			break
		}
		i = skipWS(b, i+1)
	}
	if checkFields(&f) != nil {
		return Envelope{}, false
	}
	return envelope(b, &f), true
}
