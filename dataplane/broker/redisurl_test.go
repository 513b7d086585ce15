package broker

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CheckRedisURL answers as go-redis's ParseURL does, error text included: the operator accepts
// exactly the URLs the coordinator can connect with. (The test links go-redis; the package does
// not.)
func TestCheckRedisURLAgreesWithGoRedis(t *testing.T) {
	for _, tc := range []struct {
		url     string
		wantErr string // "" accepted
	}{
		{"redis://127.0.0.1:6379/0", ""},
		{"redis://localhost", ""},
		{"redis://", ""},
		{"redis://[::1]:6380/15", ""},
		{"redis://user:p%40ss@redis:6379/2", ""},
		{"rediss://redis:6380/1?skip_verify=true", ""},
		{"unix:///run/redis.sock?db=3", ""},
		{"redis://r/1?dial_timeout=3&read_timeout=6s&write_timeout=-1&pool_timeout=&max_retries=2&protocol=2", ""},
		{"redis://r?client_name=c&pool_fifo=1&pool_size=10&min_idle_conns=1&max_idle_conns=2&max_active_conns=3&max_concurrent_dials=4", ""},
		{"redis://r?pipeline_pool_size=-1&pipeline_read_buffer_size=1&pipeline_write_buffer_size=1&min_retry_backoff=1ms&max_retry_backoff=0", ""},
		{"redis://r?conn_max_idle_time=1m&conn_max_lifetime=1h&conn_max_lifetime_jitter=1s", ""},
		{"redis://r?idle_timeout=1m&max_conn_age=1h", ""},
		{"redis://r?db=4&db=5", ""},
		{"http://redis:6379", "invalid URL scheme"},
		{"redis-server:6379", "invalid URL scheme"},
		{"redis://redis:6379/zero", "invalid database number"},
		{"redis://redis:6379/0/1", "invalid URL path"},
		{"redis://redis:6379?db=x", "invalid database number"},
		{"redis://redis:notaport", "invalid port"},
		{"unix://", "empty unix socket path"},
		{"redis://r?dial_timeout=soon", "invalid dial_timeout duration"},
		{"redis://r?pool_size=big", "invalid pool_size number"},
		{"redis://r?pool_fifo=yes", "invalid pool_fifo boolean"},
		{"redis://r?pool_size=x&dial_timeout=y", "invalid dial_timeout duration"}, // go-redis reports the first it reads
		{"redis://r?timeout=1s", "unexpected option: timeout"},
		{"redis://r?zeta=1&alpha=2", "unexpected option: alpha, zeta"},
		{"redis://r?skip_verify=true", "unexpected option: skip_verify"}, // only rediss reads it
		{"redis://r?conn_max_idle_time=1m&idle_timeout=1m", "unexpected option: idle_timeout"},
		{"redis://r?password=x", "unexpected option: password"},
		{"redis://r?conn_max_lifetime_jitter=x", "invalid conn_max_lifetime_jitter duration"},
		{"%zz", "invalid URL escape"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			got := CheckRedisURL(tc.url)
			_, want := redis.ParseURL(tc.url)
			if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
				t.Fatalf("CheckRedisURL = %v, go-redis ParseURL = %v", got, want)
			}
			switch {
			case tc.wantErr == "" && got != nil:
				t.Fatalf("rejected: %v", got)
			case tc.wantErr != "" && (got == nil || !strings.Contains(got.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one mentioning %q", got, tc.wantErr)
			}
		})
	}
}
