package config

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/clip"
)

// Connection lifetime annotations of a Service (opt-in, per Service; no
// kube-proxy mode has them). Long-lived connections defeat balancing: a
// pool of kept-alive connections stays on the endpoints it started with
// after a scale-up, and on endpoints that were removed.
const (
	// MaxConnectionAgeAnnotation: a TCP connection older than this Go
	// duration is closed at its next quiet moment ("5m"; "0" turns off the
	// node's --max-connection-age for this Service).
	MaxConnectionAgeAnnotation = "kube-userspace-proxy/max-connection-age"
	// DrainRemovedAnnotation: a TCP connection whose endpoint left the
	// Service is closed this long after, at its next quiet moment ("30s").
	DrainRemovedAnnotation = "kube-userspace-proxy/drain-removed"
)

// ConnectionLifetime is what a Service's lifetime annotations ask for.
type ConnectionLifetime struct {
	MaxAge    time.Duration
	MaxAgeSet bool // the annotation is present (else: the node's default)
	Drain     time.Duration
}

// LifetimeError is an invalid lifetime annotation: which one and why.
type LifetimeError struct {
	Key, Msg string
}

func (e *LifetimeError) Error() string {
	return fmt.Sprintf("metadata.annotations[%s]: %s", e.Key, e.Msg)
}

// ParseConnectionLifetime reads a Service's lifetime annotations; an
// error is a *LifetimeError.
func ParseConnectionLifetime(svc *v1.Service) (ConnectionLifetime, error) {
	var l ConnectionLifetime
	parse := func(key string) (time.Duration, bool, error) {
		v, ok := svc.Annotations[key]
		if !ok {
			return 0, false, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, true, &LifetimeError{key, fmt.Sprintf("%s is not a duration (e.g. \"5m\", \"90s\")", clip.Quote(v))}
		}
		if d < 0 {
			return 0, true, &LifetimeError{key, fmt.Sprintf("%s must not be negative", clip.Quote(v))}
		}
		return d, true, nil
	}
	var err error
	if l.MaxAge, l.MaxAgeSet, err = parse(MaxConnectionAgeAnnotation); err != nil {
		return ConnectionLifetime{}, err
	}
	if l.Drain, _, err = parse(DrainRemovedAnnotation); err != nil {
		return ConnectionLifetime{}, err
	}
	return l, nil
}
