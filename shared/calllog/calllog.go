// Package calllog writes one JSON line for every distinct AWS call a process makes: who made
// it, the SDK's service and operation, and the input's fields that name what the call
// touches (tables, indexes, state machines, executions, buses, keys, secrets, schedules...).
// The local stack turns it on (CAPACITY_CALL_LOG) to check every call of every function
// against the IAM policies of the synthesised template, since its emulator enforces no IAM.
// Payloads (items, plaintexts, event details) are never written, only the fields Fields
// keeps.
package calllog

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/smithy-go/middleware"
)

// Call is one AWS call as the log records it.
type Call struct {
	// Principal is who made the call: a Lambda function's name, or the ARN of an IAM role
	// (arn:...:iam::...:role/...) for calls an AWS service makes with a role.
	Principal string `json:"principal"`
	Service   string `json:"service"`   // the SDK's service id, e.g. "DynamoDB"
	Operation string `json:"operation"` // e.g. "TransactWriteItems"
	// Fields holds the input's resource fields by their path, e.g.
	// "TransactItems.0.Put.TableName": "capacity-local-state" (see Fields).
	Fields map[string]string `json:"fields,omitempty"`
}

// maxSeen bounds the set of lines a Log remembers to skip repeats; past it the set starts
// again (a repeat written twice costs a line, not a wrong answer).
const maxSeen = 100_000

// Log appends the calls of one process to a file of its own. Safe for concurrent use.
type Log struct {
	principal string
	path      string

	mu   sync.Mutex
	file *os.File
	seen map[string]struct{}
}

// New logs principal's calls to <dir>/<principal>.<pid>.jsonl (one file per process, so
// that concurrent processes never interleave lines). The file is created at the first call.
func New(dir, principal string) *Log {
	name := strings.NewReplacer("/", "_", ":", "_").Replace(principal)
	return &Log{
		principal: principal,
		path:      filepath.Join(dir, name+"."+strconv.Itoa(os.Getpid())+".jsonl"),
		seen:      map[string]struct{}{},
	}
}

// APIOption adds the log to an SDK client's middleware stack. It records at the initialize
// step, once per operation whatever its retries, before any fault injected below it.
func (l *Log) APIOption(stack *middleware.Stack) error {
	err := stack.Initialize.Add(middleware.InitializeMiddlewareFunc("calllog.Record",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if err := l.Write(Call{Service: middleware.GetServiceID(ctx), Operation: middleware.GetOperationName(ctx), Fields: Fields(in.Parameters)}); err != nil {
				return middleware.InitializeOutput{}, middleware.Metadata{}, fmt.Errorf("record the call: %w", err)
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
	if err != nil {
		return fmt.Errorf("add call log: %w", err)
	}
	return nil
}

// Write appends c (with the log's principal unless c names one) unless it was written before.
func (l *Log) Write(c Call) error {
	if c.Principal == "" {
		c.Principal = l.principal
	}
	line, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode call: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[string(line)]; ok {
		return nil
	}
	if l.file == nil {
		if l.file, err = os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return fmt.Errorf("open call log: %w", err)
		}
	}
	// One write per line, unbuffered: a process may be killed at any moment.
	if _, err := l.file.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("write call log %s: %w", l.path, err)
	}
	if len(l.seen) >= maxSeen {
		clear(l.seen)
	}
	l.seen[string(line)] = struct{}{}
	return nil
}

// Close closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file == nil {
		return nil
	}
	err := l.file.Close()
	l.file = nil
	return err
}

// Read returns every call logged under dir, repeats across processes removed. A last line
// cut short (its process killed while writing) is skipped.
func Read(dir string) ([]Call, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("list call logs: %w", err)
	}
	seen := map[string]bool{}
	var calls []Call
	for _, p := range paths {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open call log: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if seen[line] {
				continue
			}
			var c Call
			if err := json.Unmarshal([]byte(line), &c); err != nil {
				continue // a torn last line
			}
			seen[line] = true
			calls = append(calls, c)
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("read call log %s: %w", p, err)
		}
	}
	return calls, nil
}
