package stack

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The pseudo parameters of the local account. They match kumo's own defaults so that ARNs the
// template builds agree with the ARNs kumo returns.
const (
	region    = "us-east-1"
	accountID = "000000000000"
	partition = "aws"
	urlSuffix = "amazonaws.com"
)

// noValue is what Ref AWS::NoValue resolves to; maps and lists drop it, as CloudFormation does.
type noValueType struct{}

var noValue = noValueType{}

// physical is what a provisioned (or skipped) resource contributes to later references.
type physical struct {
	ref   string         // what Ref returns
	attrs map[string]any // what Fn::GetAtt returns, by attribute name
	fake  bool           // a skipped resource: any attribute resolves to a placeholder
}

// resolver evaluates CloudFormation intrinsic functions against the resources provisioned so
// far. Provisioning follows dependency order, so every reference is to a resource already there.
type resolver struct {
	t          *template
	stackName  string
	resources  map[string]*physical
	conditions map[string]bool
	evaluating map[string]bool
}

func newResolver(t *template, stackName string) *resolver {
	return &resolver{
		t:          t,
		stackName:  stackName,
		resources:  map[string]*physical{},
		conditions: map[string]bool{},
		evaluating: map[string]bool{},
	}
}

// resolve returns v with every intrinsic function replaced by its value.
func (r *resolver) resolve(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 1 {
			for name, arg := range v {
				if name == "Ref" || strings.HasPrefix(name, "Fn::") {
					return r.function(name, arg)
				}
			}
		}

		out := make(map[string]any, len(v))

		for k, e := range v {
			val, err := r.resolve(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}

			if val != noValue {
				out[k] = val
			}
		}

		return out, nil
	case []any:
		out := make([]any, 0, len(v))

		for i, e := range v {
			val, err := r.resolve(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}

			if val != noValue {
				out = append(out, val)
			}
		}

		return out, nil
	default:
		return v, nil
	}
}

// resolveString resolves v and requires a scalar, which it formats as CloudFormation would.
func (r *resolver) resolveString(v any) (string, error) {
	val, err := r.resolve(v)
	if err != nil {
		return "", err
	}

	return scalarString(val)
}

func (r *resolver) function(name string, arg any) (any, error) {
	switch name {
	case "Ref":
		id, ok := arg.(string)
		if !ok {
			return nil, fmt.Errorf("Ref: want a name, got %v", arg)
		}

		return r.ref(id)
	case "Fn::GetAtt":
		return r.getAtt(arg)
	case "Fn::Join":
		return r.join(arg)
	case "Fn::Sub":
		return r.sub(arg)
	case "Fn::Select":
		return r.selectFn(arg)
	case "Fn::Split":
		return r.split(arg)
	case "Fn::If":
		return r.ifFn(arg)
	case "Fn::FindInMap":
		return r.findInMap(arg)
	case "Fn::GetAZs":
		return []any{region + "a", region + "b", region + "c"}, nil
	case "Fn::Base64":
		s, err := r.resolveString(arg)
		if err != nil {
			return nil, fmt.Errorf("Fn::Base64: %w", err)
		}

		return base64.StdEncoding.EncodeToString([]byte(s)), nil
	case "Fn::ToJsonString":
		val, err := r.resolve(arg)
		if err != nil {
			return nil, fmt.Errorf("Fn::ToJsonString: %w", err)
		}

		data, err := json.Marshal(val)
		if err != nil {
			return nil, fmt.Errorf("Fn::ToJsonString: %w", err)
		}

		return string(data), nil
	case "Fn::Equals", "Fn::And", "Fn::Or", "Fn::Not":
		return r.evalCondition(map[string]any{name: arg})
	default:
		return nil, fmt.Errorf("%s is not supported locally", name)
	}
}

func (r *resolver) ref(id string) (any, error) {
	switch id {
	case "AWS::Region":
		return region, nil
	case "AWS::AccountId":
		return accountID, nil
	case "AWS::Partition":
		return partition, nil
	case "AWS::URLSuffix":
		return urlSuffix, nil
	case "AWS::StackName":
		return r.stackName, nil
	case "AWS::StackId":
		return fmt.Sprintf("arn:%s:cloudformation:%s:%s:stack/%s/local", partition, region, accountID, r.stackName), nil
	case "AWS::NoValue":
		return noValue, nil
	case "AWS::NotificationARNs":
		return []any{}, nil
	}

	if p, ok := r.t.Parameters[id]; ok {
		if p.Default == nil {
			return nil, fmt.Errorf("Ref %s: parameter has no Default", id)
		}

		return p.Default, nil
	}

	if _, ok := r.t.Resources[id]; !ok {
		return nil, fmt.Errorf("Ref %s: no such resource or parameter", id)
	}

	p, ok := r.resources[id]
	if !ok {
		return nil, fmt.Errorf("Ref %s: resource not provisioned (excluded by its Condition?)", id)
	}

	return p.ref, nil
}

func (r *resolver) getAtt(arg any) (any, error) {
	var id, attr string

	switch a := arg.(type) {
	case string:
		var ok bool
		if id, attr, ok = strings.Cut(a, "."); !ok {
			return nil, fmt.Errorf("Fn::GetAtt %q: want Resource.Attribute", a)
		}
	case []any:
		if len(a) != 2 {
			return nil, fmt.Errorf("Fn::GetAtt: want [resource, attribute], got %v", a)
		}

		id, _ = a[0].(string)

		name, err := r.resolveString(a[1])
		if err != nil {
			return nil, fmt.Errorf("Fn::GetAtt attribute: %w", err)
		}

		attr = name
	default:
		return nil, fmt.Errorf("Fn::GetAtt: unexpected argument %v", arg)
	}

	p, ok := r.resources[id]
	if !ok {
		return nil, fmt.Errorf("Fn::GetAtt %s.%s: resource not provisioned", id, attr)
	}

	val, ok := p.attrs[attr]
	if !ok && p.fake {
		return p.ref + "." + attr, nil
	}

	if !ok {
		return nil, fmt.Errorf("Fn::GetAtt %s.%s: attribute not available locally", id, attr)
	}

	return val, nil
}

func (r *resolver) join(arg any) (any, error) {
	a, ok := arg.([]any)
	if !ok || len(a) != 2 {
		return nil, fmt.Errorf("Fn::Join: want [delimiter, list], got %v", arg)
	}

	delim, ok := a[0].(string)
	if !ok {
		return nil, fmt.Errorf("Fn::Join: delimiter must be a string, got %v", a[0])
	}

	list, err := r.resolveList(a[1])
	if err != nil {
		return nil, fmt.Errorf("Fn::Join: %w", err)
	}

	parts := make([]string, len(list))

	for i, e := range list {
		if parts[i], err = scalarString(e); err != nil {
			return nil, fmt.Errorf("Fn::Join element %d: %w", i, err)
		}
	}

	return strings.Join(parts, delim), nil
}

func (r *resolver) selectFn(arg any) (any, error) {
	a, ok := arg.([]any)
	if !ok || len(a) != 2 {
		return nil, fmt.Errorf("Fn::Select: want [index, list], got %v", arg)
	}

	idx, err := r.resolveString(a[0])
	if err != nil {
		return nil, fmt.Errorf("Fn::Select index: %w", err)
	}

	i, err := strconv.Atoi(idx)
	if err != nil {
		return nil, fmt.Errorf("Fn::Select index %q: %w", idx, err)
	}

	list, err := r.resolveList(a[1])
	if err != nil {
		return nil, fmt.Errorf("Fn::Select: %w", err)
	}

	if i < 0 || i >= len(list) {
		return nil, fmt.Errorf("Fn::Select: index %d out of range for %d elements", i, len(list))
	}

	return list[i], nil
}

func (r *resolver) split(arg any) (any, error) {
	a, ok := arg.([]any)
	if !ok || len(a) != 2 {
		return nil, fmt.Errorf("Fn::Split: want [delimiter, string], got %v", arg)
	}

	delim, ok := a[0].(string)
	if !ok || delim == "" {
		return nil, fmt.Errorf("Fn::Split: delimiter must be a non-empty string, got %v", a[0])
	}

	s, err := r.resolveString(a[1])
	if err != nil {
		return nil, fmt.Errorf("Fn::Split: %w", err)
	}

	parts := strings.Split(s, delim)
	out := make([]any, len(parts))

	for i, p := range parts {
		out[i] = p
	}

	return out, nil
}

func (r *resolver) findInMap(arg any) (any, error) {
	a, ok := arg.([]any)
	if !ok || len(a) < 3 {
		return nil, fmt.Errorf("Fn::FindInMap: want [map, key, key], got %v", arg)
	}

	keys := make([]string, 3)

	for i := range keys {
		k, err := r.resolveString(a[i])
		if err != nil {
			return nil, fmt.Errorf("Fn::FindInMap key %d: %w", i, err)
		}

		keys[i] = k
	}

	top, ok := r.t.Mappings[keys[0]][keys[1]].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("Fn::FindInMap: no %s.%s", keys[0], keys[1])
	}

	val, ok := top[keys[2]]
	if !ok {
		return nil, fmt.Errorf("Fn::FindInMap: no %s.%s.%s", keys[0], keys[1], keys[2])
	}

	return r.resolve(val)
}

// resolveList resolves v, which must come out as a list (a literal list or, e.g., Fn::Split).
func (r *resolver) resolveList(v any) ([]any, error) {
	val, err := r.resolve(v)
	if err != nil {
		return nil, err
	}

	list, ok := val.([]any)
	if !ok {
		return nil, fmt.Errorf("want a list, got %v", val)
	}

	return list, nil
}

// scalarString formats a resolved scalar as CloudFormation does when it needs a string.
func scalarString(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case int:
		return strconv.Itoa(v), nil
	case bool:
		return strconv.FormatBool(v), nil
	default:
		return "", fmt.Errorf("want a string, got %T %v", v, v)
	}
}
