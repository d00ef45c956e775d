package stack

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// resolveOutputs evaluates the template's Outputs. Execute-api URLs of the stack's REST APIs
// become the proxy's path form, which needs no DNS for *.execute-api.localhost.
func resolveOutputs(res *resolver, t *template, endpoint string, restAPIs map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(t.Outputs))

	for _, key := range slices.Sorted(maps.Keys(t.Outputs)) {
		o := t.Outputs[key]

		if o.Condition != "" {
			ok, err := res.condition(o.Condition)
			if err != nil {
				return nil, fmt.Errorf("output %s: %w", key, err)
			}

			if !ok {
				continue
			}
		}

		val, err := res.resolveString(o.Value)
		if err != nil {
			return nil, fmt.Errorf("output %s: %w", key, err)
		}

		out[key] = localExecuteAPIURL(val, endpoint, restAPIs)
	}

	return out, nil
}

// executeAPIURL matches https://{apiId}.execute-api.{region}.amazonaws.com/{stage}{rest}.
var executeAPIURL = regexp.MustCompile(`^https://([A-Za-z0-9-]+)\.execute-api\.[a-z0-9-]+\.amazonaws\.com/([^/?#]+)(.*)$`)

// localExecuteAPIURL maps an execute-api URL of one of restAPIs (id -> stable id) to
// {endpoint}/restapis/{stable id}/{stage}/_user_request_{rest}; other values pass unchanged. The
// stage's root loses its trailing slash (a RestApi's url output has one), so that
// "$API/v1/..." has one slash where a user writes it; every client of the API takes either form.
func localExecuteAPIURL(v, endpoint string, restAPIs map[string]string) string {
	m := executeAPIURL.FindStringSubmatch(v)
	if m == nil || restAPIs[m[1]] == "" {
		return v
	}

	rest := m[3]
	if rest == "/" {
		rest = ""
	}

	return endpoint + "/restapis/" + restAPIs[m[1]] + "/" + m[2] + "/" + userRequestPrefix + rest
}

// WriteOutputsFile writes outputs in the shape of `cdk deploy --outputs-file`:
// {"<stack>": {"<OutputKey>": "<value>"}}, so that tests read the local and the real stack alike.
func WriteOutputsFile(path, stackName string, outputs map[string]string) error {
	if outputs == nil {
		outputs = map[string]string{}
	}

	data, err := json.MarshalIndent(map[string]map[string]string{stackName: outputs}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode outputs: %w", err)
	}

	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write outputs file: %w", err)
	}

	// Write then rename, so a reader never sees half a file.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".outputs-*.json")
	if err != nil {
		return fmt.Errorf("write outputs file: %w", err)
	}

	_, werr := tmp.Write(append(data, '\n'))
	cerr := tmp.Close()

	if werr != nil || cerr != nil {
		_ = os.Remove(tmp.Name())

		return fmt.Errorf("write outputs file %s: %w", path, firstErr(werr, cerr))
	}

	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())

		return fmt.Errorf("write outputs file %s: %w", path, err)
	}

	return nil
}

// ReadOutputsFile reads a file written by WriteOutputsFile or `cdk deploy --outputs-file`. The
// file must hold exactly one stack.
func ReadOutputsFile(path string) (stackName string, outputs map[string]string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, fmt.Errorf("read outputs file: %w", err)
	}

	var stacks map[string]map[string]string
	if err := json.Unmarshal(data, &stacks); err != nil {
		return "", nil, fmt.Errorf("parse outputs file %s: %w", path, err)
	}

	if len(stacks) != 1 {
		return "", nil, fmt.Errorf("outputs file %s: want one stack, found %d", path, len(stacks))
	}

	for name, outs := range stacks {
		if outs == nil {
			outs = map[string]string{}
		}

		return name, outs, nil
	}

	panic("unreachable")
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}

	return nil
}

// AWSConfig is the SDK configuration for clients of a local stack at endpoint (such as
// Endpoint()): its region, test credentials, and every service at that endpoint.
func AWSConfig(endpoint string) aws.Config {
	return aws.Config{
		Region:       region,
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(endpoint),
	}
}
