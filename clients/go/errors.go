package xcloak

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Error is a call the server refused: an argument out of range (the
// server's message names it, e.g. "ERR window must be an integer from 1 to
// 9007199254740991 (milliseconds)"), WRONGTYPE, NOPERM, or an unknown
// command with FallbackNever. Message is the server's text verbatim. It is
// returned whatever the error policy: a bad argument is the caller's bug,
// and failing open on it would disable the limit silently.
//
// The package makes Errors of its own for a configuration its constructors
// refuse (NewLimiter, nethttp.New, ulule.NewStore, ulule.NewLimiter: the
// option and its range are named), a window that is not a whole number of
// milliseconds, and a reply it cannot read; their messages start with
// "xcloak".
type Error struct {
	Message string
}

func (e *Error) Error() string { return e.Message }

// ErrUnavailable matches (errors.Is) every UnavailableError.
var ErrUnavailable = errors.New("xcloak: no answer from the server")

// UnavailableError is what PolicyRaise returns when the server did not
// answer: a connection refused, reset or closed, the limiter's timeout or
// the context's deadline, or a server that can't serve now (LOADING, BUSY,
// MASTERDOWN, CLUSTERDOWN, TRYAGAIN, READONLY, NOREPLICAS, OOM, max
// clients; in durable mode, "not replicated"). Cause is the error under it.
// The call may have been applied (it was sent): it is never sent again.
type UnavailableError struct {
	Cause error
}

func (e *UnavailableError) Error() string {
	return "xcloak: no answer from the server: " + e.Cause.Error()
}

func (e *UnavailableError) Unwrap() error { return e.Cause }

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// ErrNotReplicated is the cause of a durable-mode admission that fewer
// replicas than asked acknowledged (Options.Durable).
var ErrNotReplicated = errors.New("xcloak: not replicated")

// ErrorPolicy is what a call answers when the server does not (an outage
// or a timeout). Argument errors are never subject to it.
type ErrorPolicy int

const (
	// PolicyRaise (the default) returns an *UnavailableError.
	PolicyRaise ErrorPolicy = iota
	// PolicyAllow fails open: Allowed, Via == ViaError, Err set.
	PolicyAllow
	// PolicyDeny fails closed: not Allowed, Via == ViaError, Err set.
	PolicyDeny
)

func (p ErrorPolicy) String() string {
	switch p {
	case PolicyRaise:
		return "raise"
	case PolicyAllow:
		return "allow"
	case PolicyDeny:
		return "deny"
	}
	return "ErrorPolicy(?)"
}

// serverError is the message of a server's error reply, if err is one.
func serverError(err error) (string, bool) {
	var reply redis.Error
	if errors.As(err, &reply) {
		return reply.Error(), true
	}
	return "", false
}

// unavailablePrefixes are the replies of a server that can't serve now
// (docs/clients.md, Errors): nothing was applied, and the error policy
// answers them.
var unavailablePrefixes = []string{
	"LOADING ", "BUSY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "READONLY ",
	"NOREPLICAS ", "OOM ", "ERR max number of clients reached",
}

// classify sorts the error of a call: a refusal (*Error, returned as is), or
// an outage (an *UnavailableError, which the policy answers). A context the
// caller cancelled is returned as it is, whatever failed under it (a client
// that applies context deadlines to its sockets reads on to the Limiter's
// timeout): it is no outage, and nobody waits for a decision.
func classify(ctx context.Context, err error) error {
	var unavailable *UnavailableError
	if errors.As(err, &unavailable) {
		return unavailable
	}
	if msg, ok := serverError(err); ok {
		for _, prefix := range unavailablePrefixes {
			if strings.HasPrefix(msg, prefix) {
				return &UnavailableError{Cause: err}
			}
		}
		return &Error{Message: msg}
	}
	var own *Error
	if errors.As(err, &own) {
		return own
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	return &UnavailableError{Cause: err}
}

func isUnknownCommand(err error) bool {
	msg, ok := serverError(err)
	return ok && strings.HasPrefix(msg, "ERR unknown command")
}

func isNoScript(err error) bool {
	msg, ok := serverError(err)
	return ok && strings.HasPrefix(msg, "NOSCRIPT")
}
