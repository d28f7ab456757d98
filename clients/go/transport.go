package xcloak

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The bundled fallback scripts: byte-identical copies of src/lua/ (written
// by scripts/sync-lua.sh, checked by tests/conformance.rs).
var (
	//go:embed lua/xcloak_allow.lua
	allowLua string
	//go:embed lua/xcloak_peek.lua
	peekLua string
	//go:embed lua/xcloak_refund.lua
	refundLua string
)

// op is one of the three XCLOAK calls: its command and its script.
type op struct {
	command  interface{} // a string, boxed once
	name     string
	text     string
	script   *redis.Script // for its SHA1: the commands are sent here, as NoRetry
	readOnly bool          // PEEK: EVALSHA_RO on Redis 7.0+, so a replica may answer
}

func newOp(command, text string, readOnly bool) *op {
	return &op{command: command, name: command, text: text, script: redis.NewScript(text), readOnly: readOnly}
}

var (
	opAllow  = newOp("XCLOAK.ALLOW", allowLua, false)
	opPeek   = newOp("XCLOAK.PEEK", peekLua, true)
	opRefund = newOp("XCLOAK.REFUND", refundLua, false)
)

// noRetry is a command go-redis never sends twice. Once its bytes may have
// reached the server, none of go-redis's retry loops sends it again: the
// Client's MaxRetries loop (which by default re-sends after io.EOF, a reset
// connection or a read timeout), the ClusterClient's (which retries such
// errors on the same node, then on another) and the Ring's all stop on
// Cmder.NoRetry (go-redis 9.19+). What is known not to have been applied
// is still followed: MOVED, ASK, READONLY and errors before the write (a
// refused dial, a pool timeout).
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

var _ redis.Cmder = noRetry{}

// outcome is a call's reply, who answered it, and in durable mode how many
// replicas acknowledged it (-1: no WAIT was sent).
type outcome struct {
	reply interface{}
	via   Via
	acked int64
}

// exec sends op with args (those after the key, behind argsAfterKey free
// slots) to key's node: the command, or the script where the node has no
// module. write: in durable mode WAIT follows a reply that wrote.
func (l *Limiter) exec(ctx context.Context, key string, o *op, args []interface{}, write bool) (outcome, error) {
	durable := write && l.opt.Durable != nil
	var n *node
	switch {
	case l.opt.Fallback == FallbackAlways:
		n = l.nodes.of(l, ctx, key)
		return l.execScript(ctx, key, o, args, n, durable)
	case l.opt.Fallback == FallbackAuto && l.nodes.scripted.Load() > 0:
		n = l.nodes.of(l, ctx, key)
		if n.onScript(time.Now()) {
			return l.execScript(ctx, key, o, args, n, durable)
		}
	}
	line := args[argsAfterKey-2:]
	line[0], line[1] = o.command, key
	cmd := redis.NewCmd(ctx, line...)
	cmd.SetFirstKeyPos(1)
	acked, err := l.sendMaybeDurable(ctx, key, cmd, durable)
	if err == nil {
		if n != nil {
			l.nodes.toCommand(n) // a probe found the module
		}
		return outcome{cmd.Val(), ViaCommand, acked}, nil
	}
	if l.opt.Fallback != FallbackAuto || !isUnknownCommand(err) {
		return outcome{}, err
	}
	// No module on this node: nothing was applied, so the call goes again
	// through the script, and the node stays on it until the next probe.
	if n == nil {
		n = l.nodes.of(l, ctx, key)
	}
	l.nodes.toScript(n, time.Now().Add(l.opt.ProbeInterval))
	return l.execScript(ctx, key, o, args, n, durable)
}

// execScript runs o's script: EVALSHA (EVALSHA_RO for a read-only op, on a
// server that has it), then on NOSCRIPT the script's text (EVAL), once:
// neither an unknown command nor NOSCRIPT applied anything.
func (l *Limiter) execScript(ctx context.Context, key string, o *op, args []interface{}, n *node, durable bool) (outcome, error) {
	readOnly := o.readOnly && !n.noReadOnly.Load()
	for _, byText := range []bool{false, true} {
		name, body := "EVALSHA", o.script.Hash()
		if byText {
			name, body = "EVAL", o.text
		}
		if readOnly {
			name += "_RO"
		}
		// A fresh line: the command's, if it was sent, is go-redis's.
		line := make([]interface{}, len(args))
		copy(line[argsAfterKey:], args[argsAfterKey:])
		line[0], line[1], line[2], line[3] = name, body, 1, key
		cmd := redis.NewCmd(ctx, line...)
		cmd.SetFirstKeyPos(3)
		acked, err := l.sendMaybeDurable(ctx, key, cmd, durable)
		switch {
		case err == nil:
			return outcome{cmd.Val(), ViaScript, acked}, nil
		case readOnly && isUnknownCommand(err):
			// Redis before 7.0 has no EVALSHA_RO: plain EVALSHA from now on.
			n.noReadOnly.Store(true)
			return l.execScript(ctx, key, o, args, n, durable)
		case !byText && isNoScript(err):
			continue
		default:
			return outcome{}, err
		}
	}
	panic("unreachable")
}

// sendMaybeDurable sends cmd. In durable mode it goes on one connection of
// the key's node and, once its reply shows a write (an admission, a refund),
// WAIT follows on that same connection (WAIT waits for the connection's last
// write): one more round trip per admission, none per rejection. It returns
// WAIT's count (-1 without WAIT).
func (l *Limiter) sendMaybeDurable(ctx context.Context, key string, cmd *redis.Cmd, durable bool) (int64, error) {
	if !durable {
		return -1, l.send(ctx, cmd)
	}
	d := l.opt.Durable
	acked := int64(-1)
	// The call has the Limiter's timeout and WAIT its own (docs/clients.md,
	// Durable mode): a slow replica then shows as "not replicated".
	err := l.bounded(ctx, l.opt.Timeout+d.Timeout, func(ctx context.Context) error {
		conn, err := l.connOf(ctx, key)
		if err != nil {
			return err
		}
		defer conn.Close()
		if err := conn.Process(ctx, noRetry{cmd}); err != nil {
			return err
		}
		if !wrote(cmd.Val()) {
			return nil // a rejection wrote nothing: no WAIT
		}
		wait := redis.NewIntCmd(ctx, "WAIT", d.Replicas, d.Timeout.Milliseconds())
		if err := conn.Process(ctx, noRetryInt{wait}); err != nil {
			return err
		}
		acked = wait.Val()
		return nil
	})
	if err == nil {
		return acked, nil // f returned: acked is set
	}
	// Else f may still be running: touch nothing it writes.
	if msg, ok := serverError(err); ok && (strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")) {
		// The slot moved under the node's connection: nothing was applied; the
		// error policy answers until the client's slot map catches up.
		if c, ok := l.rdb.(*redis.ClusterClient); ok {
			c.ReloadState(ctx)
		}
		return -1, &UnavailableError{Cause: err}
	}
	return -1, err
}

// wrote: the reply is an admitting ALLOW's ([1, ...]) or a REFUND's (a count).
func wrote(reply interface{}) bool {
	if fields, ok := reply.([]interface{}); ok {
		return len(fields) > 0 && fields[0] == int64(1)
	}
	_, refund := reply.(int64)
	return refund
}

// noRetryInt is noRetry for WAIT's IntCmd.
type noRetryInt struct{ *redis.IntCmd }

func (noRetryInt) NoRetry() bool { return true }

// connOf is one connection of key's node (in a cluster, the node client of
// the key's slot; in a Ring, the key's shard): WAIT must follow the write on
// the connection that carried it. Close returns it to its pool.
func (l *Limiter) connOf(ctx context.Context, key string) (*redis.Conn, error) {
	switch c := l.rdb.(type) {
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	case *redis.Ring:
		node, err := c.GetShardClientForKey(key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	case *redis.Client:
		return c.Conn(), nil
	}
	return nil, &Error{Message: fmt.Sprintf("xcloak: durable mode needs a *redis.Client, *redis.ClusterClient or *redis.Ring, not %T", l.rdb)}
}

// send sends one command, never twice, within the Limiter's timeout.
func (l *Limiter) send(ctx context.Context, cmd *redis.Cmd) error {
	if l.opt.Timeout < 0 {
		return l.rdb.Process(ctx, noRetry{cmd})
	}
	ctx, cancel := context.WithTimeout(ctx, l.opt.Timeout)
	defer cancel()
	if l.honored {
		return l.rdb.Process(ctx, noRetry{cmd})
	}
	return l.detached(ctx, func(ctx context.Context) error { return l.rdb.Process(ctx, noRetry{cmd}) })
}

// bounded runs f within timeout (a negative Options.Timeout: unbounded). A client that applies context
// deadlines to its sockets (ContextTimeoutEnabled) is cut by the context;
// any other (go-redis's default) reads until its own ReadTimeout, so f runs
// in a goroutine of its own and the caller is answered at the deadline: the
// command, a NoRetry one, is then read to its end in the background and
// never sent again.
func (l *Limiter) bounded(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	if l.opt.Timeout < 0 {
		return f(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if l.honored {
		return f(ctx)
	}
	return l.detachedFor(ctx, timeout, f)
}

// detached runs f in a goroutine and returns its error, or at ctx's end.
func (l *Limiter) detached(ctx context.Context, f func(context.Context) error) error {
	return l.detachedFor(ctx, l.opt.Timeout, f)
}

// detachedFor is detached, reporting timeout as the figure that ran out.
func (l *Limiter) detachedFor(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return timeoutError{ctx.Err(), timeout}
	}
}

// timeoutError is the limiter's timeout (or the context's deadline or
// cancellation), with the figure.
type timeoutError struct {
	err     error
	timeout time.Duration
}

func (e timeoutError) Error() string {
	if errors.Is(e.err, context.DeadlineExceeded) {
		return "no reply within the deadline (timeout " + e.timeout.String() + ")"
	}
	return e.err.Error()
}

func (e timeoutError) Unwrap() error { return e.err }

// node is one server's choice between the command and the script.
type node struct {
	script     atomic.Bool
	probeAt    atomic.Int64 // unix ns: the command is tried again from then
	noReadOnly atomic.Bool  // no EVALSHA_RO here (Redis before 7.0)
}

func (n *node) onScript(now time.Time) bool {
	return n.script.Load() && now.UnixNano() < n.probeAt.Load()
}

// nodes is the per-node choice, keyed by the node's address (in a cluster:
// the primary of the key's slot; in a Ring: the key's shard; else one node).
type nodes struct {
	byAddr   sync.Map     // string -> *node
	scripted atomic.Int32 // nodes on the script: while 0, no lookup is made
}

func (ns *nodes) of(l *Limiter, ctx context.Context, key string) *node {
	addr := ""
	switch c := l.rdb.(type) {
	case *redis.ClusterClient:
		if client, err := c.MasterForKey(ctx, key); err == nil {
			addr = client.Options().Addr
		}
	case *redis.Ring:
		if client, err := c.GetShardClientForKey(key); err == nil {
			addr = client.Options().Addr
		}
	}
	if n, ok := ns.byAddr.Load(addr); ok {
		return n.(*node)
	}
	n, _ := ns.byAddr.LoadOrStore(addr, &node{})
	return n.(*node)
}

func (ns *nodes) toScript(n *node, probeAt time.Time) {
	n.probeAt.Store(probeAt.UnixNano())
	if !n.script.Swap(true) {
		ns.scripted.Add(1)
	}
}

func (ns *nodes) toCommand(n *node) {
	if n.script.Swap(false) {
		ns.scripted.Add(-1)
	}
}
