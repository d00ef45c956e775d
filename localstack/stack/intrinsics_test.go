package stack

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// testResolver resolves against a small template whose resources are already provisioned.
func testResolver(t *testing.T) *resolver {
	t.Helper()

	tmpl, err := parseTemplate([]byte(`{
		"Parameters": {"Env": {"Type": "String", "Default": "local"}, "NoDefault": {"Type": "String"}},
		"Mappings": {"Sizes": {"local": {"Memory": 256}}},
		"Conditions": {
			"IsLocal": {"Fn::Equals": [{"Ref": "Env"}, "local"]},
			"IsProd": {"Fn::Equals": [{"Ref": "Env"}, "prod"]},
			"LocalNotProd": {"Fn::And": [{"Condition": "IsLocal"}, {"Fn::Not": [{"Condition": "IsProd"}]}]},
			"Either": {"Fn::Or": [{"Condition": "IsProd"}, {"Fn::Equals": [{"Ref": "AWS::Region"}, "us-east-1"]}]}
		},
		"Resources": {
			"Table": {"Type": "AWS::DynamoDB::Table"},
			"Api": {"Type": "AWS::ApiGateway::RestApi"},
			"Role": {"Type": "AWS::IAM::Role"},
			"Pending": {"Type": "AWS::SQS::Queue"}
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}

	r := newResolver(tmpl, "capacity-local")
	r.resources["Table"] = &physical{ref: "capacity-local-state", attrs: map[string]any{
		"Arn": "arn:aws:dynamodb:us-east-1:000000000000:table/capacity-local-state",
	}}
	r.resources["Api"] = &physical{ref: "a1b2c3", attrs: map[string]any{"RootResourceId": "root1"}}
	r.resources["Role"] = fakePhysical("capacity-local", "Role", tmpl.Resources["Role"])

	return r
}

func TestResolve(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want any
	}{
		{"literal", `"x"`, "x"},
		{"number stays as written", `30`, json.Number("30")},
		{"Ref region", `{"Ref": "AWS::Region"}`, "us-east-1"},
		{"Ref account", `{"Ref": "AWS::AccountId"}`, "000000000000"},
		{"Ref partition", `{"Ref": "AWS::Partition"}`, "aws"},
		{"Ref URL suffix", `{"Ref": "AWS::URLSuffix"}`, "amazonaws.com"},
		{"Ref stack name", `{"Ref": "AWS::StackName"}`, "capacity-local"},
		{"Ref resource", `{"Ref": "Table"}`, "capacity-local-state"},
		{"Ref parameter default", `{"Ref": "Env"}`, "local"},
		{"Ref skipped role", `{"Ref": "Role"}`, "capacity-local-Role"},
		{"NoValue drops a map key", `{"A": "a", "B": {"Ref": "AWS::NoValue"}}`, map[string]any{"A": "a"}},
		{"NoValue drops a list element", `["a", {"Ref": "AWS::NoValue"}, "b"]`, []any{"a", "b"}},
		{"GetAtt list form", `{"Fn::GetAtt": ["Table", "Arn"]}`, "arn:aws:dynamodb:us-east-1:000000000000:table/capacity-local-state"},
		{"GetAtt string form", `{"Fn::GetAtt": "Api.RootResourceId"}`, "root1"},
		{"GetAtt of skipped role", `{"Fn::GetAtt": ["Role", "Arn"]}`, "arn:aws:iam::000000000000:role/capacity-local-Role"},
		{"GetAtt of skipped role, other attribute", `{"Fn::GetAtt": ["Role", "RoleId"]}`, "capacity-local-Role.RoleId"},
		{
			"Join CDK execute-api URL",
			`{"Fn::Join": ["", ["https://", {"Ref": "Api"}, ".execute-api.", {"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"}, "/", "local", "/"]]}`,
			"https://a1b2c3.execute-api.us-east-1.amazonaws.com/local/",
		},
		{"Join numbers", `{"Fn::Join": ["-", ["a", 1, true]]}`, "a-1-true"},
		{"Join of Split", `{"Fn::Join": ["+", {"Fn::Split": [",", "a,b,c"]}]}`, "a+b+c"},
		{"Sub pseudo and Ref", `{"Fn::Sub": "${AWS::StackName}/${Table}"}`, "capacity-local/capacity-local-state"},
		{"Sub GetAtt", `{"Fn::Sub": "arn=${Table.Arn}"}`, "arn=arn:aws:dynamodb:us-east-1:000000000000:table/capacity-local-state"},
		{"Sub variables", `{"Fn::Sub": ["${A}-${B}-${Env}", {"A": "x", "B": {"Ref": "Api"}}]}`, "x-a1b2c3-local"},
		{"Sub literal", `{"Fn::Sub": "${!Literal}-${AWS::Region}"}`, "${Literal}-us-east-1"},
		{"Sub without variables", `{"Fn::Sub": "plain"}`, "plain"},
		{"Select number index", `{"Fn::Select": [1, ["a", "b"]]}`, "b"},
		{"Select string index", `{"Fn::Select": ["0", {"Fn::Split": ["/", "x/y"]}]}`, "x"},
		{"Select from GetAZs", `{"Fn::Select": [0, {"Fn::GetAZs": ""}]}`, "us-east-1a"},
		{"Split", `{"Fn::Split": ["|", "a|b"]}`, []any{"a", "b"}},
		{"If true", `{"Fn::If": ["IsLocal", "yes", "no"]}`, "yes"},
		{"If false with NoValue", `{"X": {"Fn::If": ["IsProd", "yes", {"Ref": "AWS::NoValue"}]}}`, map[string]any{}},
		{"If And/Not", `{"Fn::If": ["LocalNotProd", 1, 2]}`, json.Number("1")},
		{"If Or", `{"Fn::If": ["Either", "a", "b"]}`, "a"},
		{"FindInMap", `{"Fn::FindInMap": ["Sizes", {"Ref": "Env"}, "Memory"]}`, json.Number("256")},
		{"Base64", `{"Fn::Base64": "hi"}`, "aGk="},
		{"ToJsonString", `{"Fn::ToJsonString": {"a": {"Ref": "Env"}}}`, `{"a":"local"}`},
		{
			"nested properties",
			`{"Environment": {"Variables": {"TABLE": {"Ref": "Table"}, "N": 3}}}`,
			map[string]any{"Environment": map[string]any{"Variables": map[string]any{"TABLE": "capacity-local-state", "N": json.Number("3")}}},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testResolver(t)

			got, err := r.resolve(decodeJSON(t, tt.in))
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}

			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	tests := []struct {
		name, in, wantErr string
	}{
		{"unknown resource", `{"Ref": "Nope"}`, "no such resource"},
		{"resource not provisioned", `{"Ref": "Pending"}`, "not provisioned"},
		{"parameter without default", `{"Ref": "NoDefault"}`, "no Default"},
		{"missing attribute", `{"Fn::GetAtt": ["Table", "StreamArn"]}`, "not available locally"},
		{"unsupported function", `{"Fn::ImportValue": "shared-vpc"}`, "not supported locally"},
		{"select out of range", `{"Fn::Select": [5, ["a"]]}`, "out of range"},
		{"join of a map", `{"Fn::Join": ["", [{"a": 1}]]}`, "want a string"},
		{"undefined condition", `{"Fn::If": ["Nope", 1, 2]}`, "not defined"},
		{"sub of unknown name", `{"Fn::Sub": "${Nope}"}`, "no such resource"},
		{"error names the property", `{"Env": {"Variables": {"X": {"Ref": "Nope"}}}}`, "Env: Variables: X: Ref Nope"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := testResolver(t).resolve(decodeJSON(t, tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestSubstitute(t *testing.T) {
	lookup := func(name string) (string, error) { return "<" + name + ">", nil }

	tests := map[string]string{
		"":                 "",
		"no vars":          "no vars",
		"${A}":             "<A>",
		"a${B.Arn}c${D}":   "a<B.Arn>c<D>",
		"${!A}${A}":        "${A}<A>",
		"unterminated ${A": "unterminated ${A",
		"${ Spaced }":      "<Spaced>",
	}

	for in, want := range tests {
		got, err := substitute(in, lookup)
		if err != nil || got != want {
			t.Errorf("substitute(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestTemplateOrder(t *testing.T) {
	tmpl, err := loadTemplate("testdata/capacity-local.template.json")
	if err != nil {
		t.Fatal(err)
	}

	order, err := tmpl.order()
	if err != nil {
		t.Fatal(err)
	}

	pos := map[string]int{}
	for i, id := range order {
		pos[id] = i
	}

	before := [][2]string{
		{"StateTable8A0D4C1C", "EchoFunction6A2C1F3B"},
		{"EchoFunctionServiceRoleDefaultPolicy5B8B9C1A", "EchoFunction6A2C1F3B"}, // DependsOn
		{"ApiF70053CD", "Apiitems4A6F3F0B"},
		{"Apiitems4A6F3F0B", "ApiitemsidB1B5F4C2"},
		{"EchoFunction6A2C1F3B", "ApiitemsidANY5D7F1E3A"},
		{"ApiitemsidANY5D7F1E3A", "ApiDeploymentB17BE62D1a2b3c4d5e6f708192a3b4c5d6e7f809"},
		{"ApiDeploymentB17BE62D1a2b3c4d5e6f708192a3b4c5d6e7f809", "ApiDeploymentStagelocal0A7A3F3C"},
		{"EchoFunction6A2C1F3B", "StateMachine2E01A3A5"},
		{"EchoFunction6A2C1F3B", "PingRule1D3E5F70"},
	}

	for _, b := range before {
		if pos[b[0]] >= pos[b[1]] {
			t.Errorf("%s must come before %s; order %v", b[0], b[1], order)
		}
	}

	if len(order) != len(tmpl.Resources) {
		t.Errorf("order has %d resources, template %d", len(order), len(tmpl.Resources))
	}
}

func TestTemplateOrderCycle(t *testing.T) {
	tmpl, err := parseTemplate([]byte(`{"Resources": {
		"A": {"Type": "AWS::SQS::Queue", "Properties": {"X": {"Ref": "B"}}},
		"B": {"Type": "AWS::SQS::Queue", "Properties": {"X": {"Fn::Sub": "${A.Arn}"}}},
		"C": {"Type": "AWS::SQS::Queue"}
	}}`))
	if err != nil {
		t.Fatal(err)
	}

	if _, err := tmpl.order(); err == nil || !strings.Contains(err.Error(), "A, B") {
		t.Fatalf("err = %v, want a cycle among A, B", err)
	}
}

func TestStackNameFromPath(t *testing.T) {
	tests := map[string]string{
		"cdk.out/capacity-local.template.json": "capacity-local",
		"/x/stack.json":                        "stack",
		"template":                             "template",
		"":                                     "local",
	}

	for in, want := range tests {
		if got := stackNameFromPath(in); got != want {
			t.Errorf("stackNameFromPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func decodeJSON(t *testing.T, s string) any {
	t.Helper()

	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()

	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}

	return v
}
