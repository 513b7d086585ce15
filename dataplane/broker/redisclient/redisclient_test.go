package redisclient

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestOptions(t *testing.T) {
	env := func(k string) string { return map[string]string{"PW": "from-env"}[k] }
	tests := map[string]struct {
		url, passwordEnv string
		wantPassword     string
		wantRead         time.Duration
		wantRetries      int
	}{
		"timeouts from the caller":          {url: "redis://h:6379/0", wantRead: 50 * time.Millisecond, wantRetries: defaultMaxRetries},
		"the URL's own timeout and retries": {url: "redis://h:6379/0?read_timeout=2s&max_retries=5", wantRead: 2 * time.Second, wantRetries: 5},
		"password from the environment":     {url: "redis://:url-pw@h:6379/0", passwordEnv: "PW", wantPassword: "from-env", wantRead: 50 * time.Millisecond, wantRetries: defaultMaxRetries},
		"empty variable keeps the URL's":    {url: "redis://:url-pw@h:6379/0", passwordEnv: "UNSET", wantPassword: "url-pw", wantRead: 50 * time.Millisecond, wantRetries: defaultMaxRetries},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			base, err := redis.ParseURL(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			o := Options(base, tc.passwordEnv, env, 50*time.Millisecond, "me")
			if o.Password != tc.wantPassword || o.ReadTimeout != tc.wantRead || o.MaxRetries != tc.wantRetries || o.DialTimeout != 50*time.Millisecond ||
				o.ClientName != "me" || !o.ContextTimeoutEnabled || !o.DisableIdentity {
				t.Fatalf("%+v", o)
			}
			if base.ClientName == "me" {
				t.Fatal("the URL's options were modified")
			}
		})
	}
}
