package chattemplate

import (
	"testing"
	"time"
)

func TestStrftime(t *testing.T) {
	at := time.Date(2024, 3, 9, 7, 5, 3, 0, time.FixedZone("CET", 3600))
	for _, tc := range []struct{ format, want string }{
		{"%d %b %Y", "09 Mar 2024"}, // Llama 3.1's date line
		{"%Y-%m-%d", "2024-03-09"},
		{"%-d %B %Y", "9 March 2024"},
		{"%A %a %H:%M:%S %I %p", "Saturday Sat 07:05:03 07 AM"},
		{"%j %y %e %u %w", "069 24  9 6 6"},
		{"%F %T %D %R", "2024-03-09 07:05:03 03/09/24 07:05"},
		{"%c", "Sat Mar  9 07:05:03 2024"},
		{"%z %Z %%", "+0100 CET %"},
		{"%Q and 100%", "%Q and 100%"},
	} {
		if got := strftime(at, tc.format); got != tc.want {
			t.Errorf("strftime(%q) = %q, want %q", tc.format, got, tc.want)
		}
	}
}
