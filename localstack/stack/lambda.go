package stack

import (
	"github.com/openrelay/capacity/localstack/quota"

	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
)

// Lambda's defaults for a function that does not set them.
const (
	defaultMemoryMB   = 128
	defaultTimeoutSec = 3
)

type cfnFunction struct {
	FunctionName  string
	Description   string
	Handler       string
	Runtime       string
	Role          string
	Timeout       cfnInt
	MemorySize    cfnInt
	Architectures []string
	// ReservedConcurrentExecutions is kept for the quota model (kumo ignores it).
	ReservedConcurrentExecutions cfnInt
	Environment                  struct {
		Variables map[string]any
	}
}

func provisionFunction(ctx context.Context, p *provisioner, id string, r *resource, props map[string]any) (*physical, error) {
	var f cfnFunction
	if err := decodeProps(props, &f); err != nil {
		return nil, err
	}

	name := valueOr(f.FunctionName, generatedName(p.stackName, id, 64))

	env, err := stringMap(f.Environment.Variables)
	if err != nil {
		return nil, fmt.Errorf("function %s environment: %w", name, err)
	}

	p.quotaRes.Functions = append(p.quotaRes.Functions, quota.Function{Name: name, Reserved: int(f.ReservedConcurrentExecutions)})

	spec := functionSpec{
		name:    name,
		code:    r.functionName(),
		handler: valueOr(f.Handler, "bootstrap"),
		memory:  int32(valueOr(f.MemorySize, defaultMemoryMB)),
		timeout: int32(valueOr(f.Timeout, defaultTimeoutSec)),
		env:     env,
	}

	role := f.Role
	if role == "" {
		role = fmt.Sprintf("arn:%s:iam::%s:role/%s-local", partition, accountID, name)
	}

	in := &lambda.CreateFunctionInput{
		FunctionName: aws.String(name),
		Description:  optString(f.Description),
		Role:         aws.String(role),
		Handler:      aws.String(spec.handler),
		Runtime:      types.Runtime(valueOr(f.Runtime, string(types.RuntimeProvidedal2023))),
		// kumo registers the function but never runs its code (the runner attaches the host
		// bootstrap to the runtime API instead), so any small zip does.
		Code:        &types.FunctionCode{ZipFile: placeholderZip()},
		Timeout:     aws.Int32(spec.timeout),
		MemorySize:  aws.Int32(spec.memory),
		Environment: &types.Environment{Variables: env},
	}

	for _, a := range f.Architectures {
		in.Architectures = append(in.Architectures, types.Architecture(a))
	}

	out, err := p.lambda.CreateFunction(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("create function %s: %w", name, err)
	}

	spec.arn = aws.ToString(out.FunctionArn)
	if spec.code != "" {
		p.functions = append(p.functions, spec)
	}

	p.log.Info("created function", "function", name, "code", spec.code)

	return &physical{ref: name, attrs: map[string]any{"Arn": spec.arn}}, nil
}

var placeholderZip = sync.OnceValue(func() []byte {
	var buf bytes.Buffer

	zw := zip.NewWriter(&buf)

	w, err := zw.Create("bootstrap")
	if err == nil {
		_, err = w.Write([]byte("#!/bin/sh\necho 'local stack: this function runs as a host process' >&2\nexit 1\n"))
	}

	if err == nil {
		err = zw.Close()
	}

	if err != nil {
		panic(fmt.Sprintf("build placeholder zip: %v", err)) // writing to memory cannot fail
	}

	return buf.Bytes()
})

func valueOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}

	return v
}
