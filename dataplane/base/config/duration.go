package config

import (
	"fmt"
	"time"
)

// Duration is a time.Duration written as a Go duration string with a unit ("30s", "1m30s").
// A bare number such as "30" is rejected: it is ambiguous.
type Duration time.Duration

// ParseDuration parses a duration string that carries a unit (or is exactly "0").
func ParseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration with a unit (e.g. 30s, 2m, 1h): %v", s, unwrapParse(err))
	}
	return Duration(d), nil
}

// Std returns the value as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats the duration like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText implements encoding.TextMarshaler, used by both YAML and JSON encoders.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// unwrapParse drops the repeated input from time.ParseDuration's message.
func unwrapParse(err error) string {
	msg := err.Error()
	const prefix = "time: "
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		msg = msg[len(prefix):]
	}
	for i := 0; i < len(msg); i++ {
		if msg[i] == '"' {
			return msg[:max(0, i-1)]
		}
	}
	return msg
}
