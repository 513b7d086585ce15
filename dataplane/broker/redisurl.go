package broker

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CheckRedisURL reports whether go-redis's ParseURL would accept raw, with the error it would
// return, without linking go-redis (the operator validates pipelines with this package). It
// follows ParseURL of the go-redis version in go.mod: the schemes redis, rediss and unix, a
// database number in the path or the db option, and the query options go-redis reads (unknown
// ones are an error). TestCheckRedisURLAgreesWithGoRedis keeps the two in step.
func CheckRedisURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "redis", "rediss":
		f := strings.FieldsFunc(u.Path, func(r rune) bool { return r == '/' })
		switch len(f) {
		case 0:
		case 1:
			if _, err := strconv.Atoi(f[0]); err != nil {
				return fmt.Errorf("redis: invalid database number: %q", f[0])
			}
		default:
			return fmt.Errorf("redis: invalid URL path: %s", u.Path)
		}
		return checkRedisQuery(u.Query(), u.Scheme == "rediss")
	case "unix":
		if strings.TrimSpace(u.Path) == "" {
			return errors.New("redis: empty unix socket path")
		}
		return checkRedisQuery(u.Query(), false)
	default:
		return fmt.Errorf("redis: invalid URL scheme: %s", u.Scheme)
	}
}

// redisOption is a query option go-redis reads, and how it parses it.
type redisOption struct {
	name string
	kind byte // 'i' int, 'd' duration, 'b' bool, 's' string
}

// redisOptions are the query options of go-redis's setupConnParams, in the order it reads them
// (the first error is the one it reports). The db option and the options with aliases or
// conditions are handled by checkRedisQuery.
var redisOptions = []redisOption{
	{"protocol", 'i'}, {"client_name", 's'}, {"max_retries", 'i'},
	{"min_retry_backoff", 'd'}, {"max_retry_backoff", 'd'},
	{"dial_timeout", 'd'}, {"read_timeout", 'd'}, {"write_timeout", 'd'},
	{"pool_fifo", 'b'}, {"pool_size", 'i'}, {"pool_timeout", 'd'},
	{"min_idle_conns", 'i'}, {"max_idle_conns", 'i'}, {"max_active_conns", 'i'}, {"max_concurrent_dials", 'i'},
	{"pipeline_pool_size", 'i'}, {"pipeline_read_buffer_size", 'i'}, {"pipeline_write_buffer_size", 'i'},
}

// checkRedisQuery checks the query options as go-redis reads them.
func checkRedisQuery(values url.Values, tls bool) error {
	q := redisQuery{q: values}
	if v := q.take("db"); v != "" {
		if _, err := strconv.Atoi(v); err != nil {
			return fmt.Errorf("redis: invalid database number: %w", err)
		}
	}
	for _, o := range redisOptions {
		switch o.kind {
		case 'i':
			q.int(o.name)
		case 'd':
			q.duration(o.name)
		case 'b':
			q.bool(o.name)
		default:
			q.take(o.name)
		}
	}
	q.durationOr("conn_max_idle_time", "idle_timeout")
	q.durationOr("conn_max_lifetime", "max_conn_age")
	if q.has("conn_max_lifetime_jitter") {
		q.duration("conn_max_lifetime_jitter")
	}
	if tls && q.has("skip_verify") {
		q.bool("skip_verify")
	}
	if q.err != nil {
		return q.err
	}
	if len(q.q) > 0 {
		left := make([]string, 0, len(q.q))
		for k := range q.q {
			left = append(left, k)
		}
		slices.Sort(left)
		return fmt.Errorf("redis: unexpected option: %s", strings.Join(left, ", "))
	}
	return nil
}

// redisQuery reads query options the way go-redis does: the last value of a repeated option
// counts, and every option read is removed so that what is left is unknown.
type redisQuery struct {
	q   url.Values
	err error
}

func (o *redisQuery) has(name string) bool { return len(o.q[name]) > 0 }

func (o *redisQuery) take(name string) string {
	vs := o.q[name]
	if len(vs) == 0 {
		return ""
	}
	delete(o.q, name)
	return vs[len(vs)-1]
}

func (o *redisQuery) int(name string) {
	s := o.take(name)
	if s == "" {
		return
	}
	if _, err := strconv.Atoi(s); err != nil && o.err == nil {
		o.err = fmt.Errorf("redis: invalid %s number: %w", name, err)
	}
}

func (o *redisQuery) duration(name string) {
	s := o.take(name)
	if s == "" {
		return
	}
	if _, err := strconv.Atoi(s); err == nil {
		return
	}
	if _, err := time.ParseDuration(s); err != nil && o.err == nil {
		o.err = fmt.Errorf("redis: invalid %s duration: %w", name, err)
	}
}

// durationOr reads name, or its older alias when name is absent (the alias is then unknown).
func (o *redisQuery) durationOr(name, alias string) {
	if o.has(name) {
		o.duration(name)
		return
	}
	o.duration(alias)
}

func (o *redisQuery) bool(name string) {
	switch s := o.take(name); s {
	case "true", "1", "false", "0", "":
	default:
		if o.err == nil {
			o.err = fmt.Errorf("redis: invalid %s boolean: expected true/false/1/0 or an empty string, got %q", name, s)
		}
	}
}
