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
		ks := i + 1
		ke, kesc, err := scanString(b, ks)
		if err != nil {
			break
		}
		key := classifyKey(b[ks:ke], kesc)
		i = skipWS(b, ke+1)
		if i >= len(b) || b[i] != ':' {
			break
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			break
		}
		if b[i] == '"' {
			vs := i + 1
			ve, vesc, err := scanString(b, vs)
			if err != nil {
				break
			}
			if key != keyOther {
				f[key] = field{start: vs, end: ve, kind: kindString, esc: vesc}
			}
			i = ve + 1
		} else {
			vs := i
			if i, err = skipValue(b, i); err != nil {
				break
			}
			if key != keyOther {
				kind := uint8(kindOther)
				if b[vs] == 'n' {
					kind = kindNull
				}
				f[key] = field{start: vs, end: i, kind: kind}
			}
		}
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ',' {
			break
		}
		i = skipWS(b, i+1)
	}
	if f[keyType].kind != kindString {
		return Envelope{}, false
	}
	if k := f[keyID].kind; k != kindAbsent && k != kindString {
		return Envelope{}, false
	}
	if f[keyParentID].kind == kindOther || f[keyTargetID].kind == kindOther {
		return Envelope{}, false
	}
	return envelope(b, &f), true
}
