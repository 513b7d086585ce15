package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	cfg, level, err := parseFlags([]string{"--redis-url", "redis://r:6380/1", "--coordinator", "http://c:8080",
		"--queue", "a, b,,c", "--concurrency", "9", "--result-ttl", "2h", "--cancel-poll", "100ms", "-v", "4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RedisURL != "redis://r:6380/1" || cfg.Coordinator != "http://c:8080" || strings.Join(cfg.Queues, "|") != "a|b|c" ||
		cfg.Concurrency != 9 || cfg.ResultTTL != 2*time.Hour || cfg.CancelPoll != 100*time.Millisecond || level != 4 {
		t.Fatalf("parsed %+v level %d", cfg, level)
	}
	if _, _, err := parseFlags([]string{"stray"}, io.Discard); err == nil {
		t.Fatal("a stray argument was accepted")
	}
	if _, _, err := parseFlags([]string{"--nope"}, io.Discard); err == nil {
		t.Fatal("an unknown flag was accepted")
	}
}
