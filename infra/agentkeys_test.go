package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
)

// agentMasterSecretID is the logical id of the stack's agent master secret.
func agentMasterSecretID(t *testing.T, tp tmpl, env string) string {
	t.Helper()
	id, _ := tp.one(t, "AWS::SecretsManager::Secret", "Name", "capacity/"+env+"/agent-master")
	return id
}

// TestAgentMasterSecret: the stack creates the master secret, generated (its value is in
// neither the template nor a function's configuration), kept outside local and dev.
func TestAgentMasterSecret(t *testing.T) {
	for _, tc := range []struct {
		env    string
		policy string
	}{{"local", "Delete"}, {"dev", "Delete"}, {"prod", "Retain"}} {
		t.Run(tc.env, func(t *testing.T) {
			tp := synth(t, tc.env)
			if n := len(tp.resources("AWS::SecretsManager::Secret")); n != 1 {
				t.Fatalf("%d secrets, want 1", n)
			}
			_, r := tp.one(t, "AWS::SecretsManager::Secret", "Name", "capacity/"+tc.env+"/agent-master")
			want := map[string]any{"ExcludePunctuation": true, "IncludeSpace": false, "PasswordLength": float64(64)}
			if got := props(r)["GenerateSecretString"]; !reflect.DeepEqual(got, want) {
				t.Errorf("GenerateSecretString %s, want %s", toJSON(got), toJSON(want))
			}
			if _, ok := props(r)["SecretString"]; ok {
				t.Error("the secret's value is in the template")
			}
			if r["DeletionPolicy"] != tc.policy || r["UpdateReplacePolicy"] != tc.policy {
				t.Errorf("DeletionPolicy %v UpdateReplacePolicy %v, want %s", r["DeletionPolicy"], r["UpdateReplacePolicy"], tc.policy)
			}
			all := toJSON(tp)
			for _, leak := range []string{"{{resolve:", "AGENT_SECRET\""} {
				if strings.Contains(all, leak) {
					t.Errorf("template contains %s", leak)
				}
			}
		})
	}
}

// TestExistingAgentMasterSecret: given an existing secret's name, the stack creates none and
// terminate-node reads that one, by name, with GetSecretValue on its ARNs only.
func TestExistingAgentMasterSecret(t *testing.T) {
	ctx := cdkJSONContext(t)
	app := awscdk.NewApp(&awscdk.AppProps{Context: &ctx})
	s, err := NewCapacityStack(app, CapacityStackProps{Env: "prod", AssetRoot: testAssetRoot, AgentMasterSecretName: "ops/agent-master"})
	if err != nil {
		t.Fatal(err)
	}
	tp := tmpl(*assertions.Template_FromStack(s.Stack, nil).ToJSON())
	if n := len(tp.resources("AWS::SecretsManager::Secret")); n != 0 {
		t.Errorf("%d secrets created, want 0", n)
	}
	// terminate-node alone (the keys of nodes still at generation 0).
	_, fn := functionByName(t, tp, "prod", "terminate-node")
	if got := props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)["AGENT_MASTER_SECRET_ID"]; got != "ops/agent-master" {
		t.Errorf("terminate-node AGENT_MASTER_SECRET_ID = %s", toJSON(got))
	}
	got := rolePermissions(t, tp, roleOf(t, fn, "Role"), "lambda.amazonaws.com", slices.Concat(schedulingActions, []string{"xray:PutTelemetryRecords", "xray:PutTraceSegments"})...)
	arn := toJSON(map[string]any{"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:ops/agent-master-??????"})
	if !reflect.DeepEqual(got[arn], []string{"secretsmanager:GetSecretValue"}) {
		t.Errorf("terminate-node permissions %v, want GetSecretValue on %s", got, arn)
	}
	_, api := functionByName(t, tp, "prod", "api")
	for res, actions := range rolePermissions(t, tp, roleOf(t, api, "Role"), "lambda.amazonaws.com", slices.Concat(schedulingActions, []string{"xray:PutTelemetryRecords", "xray:PutTraceSegments"})...) {
		if slices.Contains(actions, "secretsmanager:GetSecretValue") {
			t.Errorf("api may read %s", res)
		}
	}
}

func agentKeysKeyID(t *testing.T, tp tmpl) string {
	t.Helper()
	for id, r := range tp.resources("AWS::KMS::Key") {
		if strings.Contains(toJSON(props(r)["Description"]), "agent") {
			return id
		}
	}
	t.Fatal("no agent keys KMS key")
	return ""
}

// TestApiCannotOpenAgentKeys: the internet-facing api function can seal a new node's agent key
// but obtain no existing one: no action of its role decrypts or re-encrypts under the agent
// keys' KMS key or reads any secret, the key's policy denies it those actions whatever its role
// says, of all the stack's roles only terminate-node's may Decrypt (agent keys only), and only
// it may read any secret (the agent master secret, under which it reseals the keys it opened:
// shared/agent.Resealer). The key rotates and is kept with the stack's data.
func TestApiCannotOpenAgentKeys(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			keyID := agentKeysKeyID(t, tp)
			_, api := functionByName(t, tp, env, "api")
			apiRole := roleOf(t, api, "Role")
			_, tn := functionByName(t, tp, env, "terminate-node")
			tnRole := roleOf(t, tn, "Role")
			opening := []string{"kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey", "kms:GenerateDataKeyWithoutPlaintext", "kms:CreateGrant", "kms:Encrypt"}
			cwRole := apiGatewayCloudWatchRoleID(t, tp)
			for id, role := range tp.resources("AWS::IAM::Role") {
				if id == cwRole {
					continue
				}
				for res, actions := range rolePermissions(t, tp, id, assumedBy(t, role), slices.Concat(logDeliveryActions, stateMachineTraceActions, schedulingActions)...) {
					for _, a := range actions {
						switch {
						case id == apiRole && (strings.HasPrefix(a, "secretsmanager:") || strings.HasPrefix(a, "kms:") && a != "kms:Encrypt"):
							t.Errorf("api role: %s on %s", a, res)
						case strings.HasPrefix(a, "secretsmanager:") && id != tnRole:
							// Resealed agent keys open under a key derived from the master secret.
							t.Errorf("role %s: %s on %s; only terminate-node may read the agent master secret", id, a, res)
						case strings.HasPrefix(a, "kms:") && id != apiRole && !(id == tnRole && a == "kms:Decrypt"):
							t.Errorf("role %s: %s on %s; only terminate-node may open agent keys", id, a, res)
						case slices.Contains(opening, a) && !strings.Contains(res, `"`+keyID+`"`):
							t.Errorf("role %s: %s on %s, not the agent keys' key", id, a, res)
						}
					}
				}
			}
			vars := props(api)["Environment"].(map[string]any)["Variables"].(map[string]any)
			if _, ok := vars["AGENT_MASTER_SECRET_ID"]; ok {
				t.Error("the api function is told the agent master secret")
			}
			for name, fn := range map[string]map[string]any{"api": api, "terminate-node": tn} {
				got := props(fn)["Environment"].(map[string]any)["Variables"].(map[string]any)["AGENT_KEYS_KMS_KEY_ID"]
				if !reflect.DeepEqual(got, getAtt(keyID, "Arn")) {
					t.Errorf("%s AGENT_KEYS_KMS_KEY_ID = %s", name, toJSON(got))
				}
			}

			// The key's own policy denies the api role every way to an agent key in clear.
			key := tp.resources("AWS::KMS::Key")[keyID]
			var denied []string
			for _, st := range asList(props(key)["KeyPolicy"].(map[string]any)["Statement"]) {
				st := st.(map[string]any)
				if st["Effect"] == "Deny" && reflect.DeepEqual(st["Principal"], map[string]any{"AWS": getAtt(apiRole, "Arn")}) {
					for _, a := range asList(st["Action"]) {
						denied = append(denied, a.(string))
					}
				}
			}
			for _, a := range []string{"kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey*", "kms:CreateGrant"} {
				if !slices.Contains(denied, a) {
					t.Errorf("the key policy does not deny the api role %s (denies %v)", a, denied)
				}
			}
			if props(key)["EnableKeyRotation"] != true {
				t.Error("the agent keys' key does not rotate")
			}
			want := map[string]string{"local": "Delete", "prod": "Retain"}[env]
			if key["DeletionPolicy"] != want {
				t.Errorf("DeletionPolicy %v, want %s", key["DeletionPolicy"], want)
			}
		})
	}
}

// TestAgentKeysKeyPolicy: the agent keys' key policy names everyone who may use the key, and
// delegates no use to IAM: the account may administer the key (so it stays manageable) but
// neither seal nor open with it, the api role may only seal, terminate-node's role and the
// environment's break-glass role (cdk.json agentKeysBreakGlassRole) may only open, each for
// agent keys only. The master secret's policy denies its value to every principal but
// terminate-node's role and the break-glass role.
func TestAgentKeysKeyPolicy(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			tp := synth(t, env)
			account := map[string]string{"local": "000000000000", "prod": "333333333333"}[env]
			breakGlass := "arn:aws:iam::" + account + ":role/capacity-agent-keys-break-glass"
			_, api := functionByName(t, tp, env, "api")
			_, tn := functionByName(t, tp, env, "terminate-node")
			apiRole, tnRole := getAtt(roleOf(t, api, "Role"), "Arn"), getAtt(roleOf(t, tn, "Role"), "Arn")
			root := map[string]any{"Fn::Join": []any{"", []any{"arn:", ref("AWS::Partition"), ":iam::", ref("AWS::AccountId"), ":root"}}}
			agentKeysOnly := " if " + toJSON(map[string]any{
				"Null":         map[string]any{"kms:EncryptionContext:nodeId": "false"},
				"StringEquals": map[string]any{"kms:EncryptionContext:purpose": "capacity-agent-key"},
			})

			key := tp.resources("AWS::KMS::Key")[agentKeysKeyID(t, tp)]
			allowed := map[string][]string{}
			for _, st := range asList(props(key)["KeyPolicy"].(map[string]any)["Statement"]) {
				st := st.(map[string]any)
				if st["Effect"] != "Allow" {
					continue
				}
				who := toJSON(st["Principal"])
				if c := st["Condition"]; c != nil {
					who += " if " + toJSON(c)
				}
				for _, a := range asList(st["Action"]) {
					allowed[who] = append(allowed[who], a.(string))
				}
			}
			for k := range allowed {
				slices.Sort(allowed[k])
			}
			want := map[string][]string{
				toJSON(map[string]any{"AWS": root}):                       agentKeysAdminActions,
				toJSON(map[string]any{"AWS": apiRole}) + agentKeysOnly:    {"kms:Encrypt"},
				toJSON(map[string]any{"AWS": tnRole}) + agentKeysOnly:     {"kms:Decrypt"},
				toJSON(map[string]any{"AWS": breakGlass}) + agentKeysOnly: {"kms:Decrypt"},
			}
			if !reflect.DeepEqual(allowed, want) {
				t.Errorf("key policy allows\n got %v\nwant %v", allowed, want)
			}
			for _, a := range agentKeysAdminActions {
				if strings.Contains(a, "*") || slices.Contains([]string{"kms:Decrypt", "kms:Encrypt", "kms:CreateGrant"}, a) ||
					strings.HasPrefix(a, "kms:ReEncrypt") || strings.HasPrefix(a, "kms:GenerateDataKey") {
					t.Errorf("the account may %s with the key", a)
				}
			}

			if n := len(tp.resources("AWS::SecretsManager::ResourcePolicy")); n != 1 {
				t.Fatalf("%d secret policies, want 1", n)
			}
			for _, p := range tp.resources("AWS::SecretsManager::ResourcePolicy") {
				p := props(p)
				if !reflect.DeepEqual(p["SecretId"], ref(agentMasterSecretID(t, tp, env))) || p["BlockPublicPolicy"] != true {
					t.Errorf("secret policy on %s, BlockPublicPolicy %v", toJSON(p["SecretId"]), p["BlockPublicPolicy"])
				}
				got := toJSON(p["ResourcePolicy"].(map[string]any)["Statement"])
				wantSt := toJSON([]any{map[string]any{
					"Action": "secretsmanager:GetSecretValue", "Effect": "Deny", "Principal": map[string]any{"AWS": "*"}, "Resource": "*",
					"Condition": map[string]any{"StringNotEquals": map[string]any{"aws:PrincipalArn": []any{tnRole, breakGlass}}},
					"Sid":       "OnlyItsReadersGetTheValue",
				}})
				if got != wantSt {
					t.Errorf("secret policy\n got %s\nwant %s", got, wantSt)
				}
			}
		})
	}
}
