package stack

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/openrelay/capacity/localstack/iamcheck"
)

// IAM returns what the template says of permissions, resolved with the stack's own
// intrinsics (the ARNs the functions see): each role's identity policies, which function runs
// as which role, the resource policies of KMS keys, event buses and queues, and the tables'
// partition keys. The emulator enforces none of it; iamcheck evaluates it against the calls
// the functions logged (Options.CallLogDir).
func (s *Stack) IAM() (iamcheck.Setup, error) {
	if s.prov == nil {
		return iamcheck.Setup{}, fmt.Errorf("local stack: not provisioned")
	}
	return iamSetup(s.prov.t, s.prov.res)
}

func iamSetup(t *template, res *resolver) (iamcheck.Setup, error) {
	setup := iamcheck.Setup{
		Account:          iamcheck.Account{Partition: partition, Region: region, ID: accountID},
		Tables:           map[string]iamcheck.TableKeys{},
		Roles:            map[string]iamcheck.Role{},
		Functions:        map[string]string{},
		ResourcePolicies: map[string][]iamcheck.Statement{},
	}
	roleByName := map[string]string{} // what Ref of a role gives -> its ARN
	for _, id := range slices.Sorted(maps.Keys(t.Resources)) {
		if t.Resources[id].Type != "AWS::IAM::Role" || res.resources[id] == nil {
			continue
		}
		if err := addRole(&setup, id, t.Resources[id], res); err != nil {
			return setup, err
		}
		arn, _ := res.resources[id].attrs["Arn"].(string)
		roleByName[res.resources[id].ref] = arn
	}
	for _, id := range slices.Sorted(maps.Keys(t.Resources)) {
		r := t.Resources[id]
		if res.resources[id] == nil || !iamTypes[r.Type] {
			continue // excluded by its condition, or nothing to do with permissions
		}
		props, err := res.resolve(r.Properties)
		if err != nil {
			return setup, fmt.Errorf("resolve %s (%s): %w", id, r.Type, err)
		}
		p, _ := props.(map[string]any)
		switch r.Type {
		case "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy":
			err = attachPolicy(&setup, id, p, roleByName)
		case "AWS::Lambda::Function":
			fnRole, _ := p["Role"].(string)
			setup.Functions[res.resources[id].ref] = fnRole
		case "AWS::DynamoDB::Table", "AWS::DynamoDB::GlobalTable":
			setup.Tables[res.resources[id].ref] = tableKeys(p)
		case "AWS::KMS::Key":
			arn, _ := res.resources[id].attrs["Arn"].(string)
			err = addResourcePolicy(&setup, id, arn, p["KeyPolicy"])
		case "AWS::Events::EventBusPolicy":
			bus, _ := p["EventBusName"].(string)
			doc := p["Policy"]
			if st, ok := p["Statement"]; ok {
				doc = map[string]any{"Statement": []any{st}}
			}
			err = addResourcePolicy(&setup, id, fmt.Sprintf("arn:%s:events:%s:%s:event-bus/%s", partition, region, accountID, bus), doc)
		case "AWS::SecretsManager::ResourcePolicy":
			secret, _ := p["SecretId"].(string) // the secret's ARN (its Ref) when the stack made it
			err = addResourcePolicy(&setup, id, secret, p["ResourcePolicy"])
		case "AWS::SQS::QueuePolicy":
			urls, _ := p["Queues"].([]any)
			for _, u := range urls {
				if arn := queueARN(res, u); arn != "" && err == nil {
					err = addResourcePolicy(&setup, id, arn, p["PolicyDocument"])
				}
			}
		}
		if err != nil {
			return setup, err
		}
	}
	return setup, nil
}

// iamTypes are the resource types iamSetup reads (besides roles).
var iamTypes = map[string]bool{
	"AWS::IAM::Policy": true, "AWS::IAM::ManagedPolicy": true, "AWS::Lambda::Function": true,
	"AWS::DynamoDB::Table": true, "AWS::DynamoDB::GlobalTable": true,
	"AWS::KMS::Key": true, "AWS::Events::EventBusPolicy": true, "AWS::SQS::QueuePolicy": true,
	"AWS::SecretsManager::ResourcePolicy": true,
}

// addRole records a role with its inline policies; attached managed policies of the
// template come with attachPolicy, AWS managed ones are only named.
func addRole(setup *iamcheck.Setup, id string, r *resource, res *resolver) error {
	props, err := res.resolve(r.Properties)
	if err != nil {
		return fmt.Errorf("resolve role %s: %w", id, err)
	}
	p, _ := props.(map[string]any)
	arn, _ := res.resources[id].attrs["Arn"].(string)
	role := iamcheck.Role{LogicalID: id, ARN: arn}
	inline, _ := p["Policies"].([]any)
	for _, ip := range inline {
		m, _ := ip.(map[string]any)
		name, _ := m["PolicyName"].(string)
		st, err := iamcheck.ParseDocument(id+"/"+name, m["PolicyDocument"])
		if err != nil {
			return fmt.Errorf("role %s: %w", id, err)
		}
		role.Statements = append(role.Statements, st...)
	}
	managed, _ := p["ManagedPolicyArns"].([]any)
	for _, m := range managed {
		if s, _ := m.(string); strings.Contains(s, ":iam::aws:policy/") {
			role.Unmodelled = append(role.Unmodelled, s)
		}
	}
	setup.Roles[arn] = role
	return nil
}

// attachPolicy adds an AWS::IAM::Policy's (or ManagedPolicy's) statements to the roles it
// names.
func attachPolicy(setup *iamcheck.Setup, id string, p map[string]any, roleByName map[string]string) error {
	st, err := iamcheck.ParseDocument(id, p["PolicyDocument"])
	if err != nil {
		return err
	}
	roles, _ := p["Roles"].([]any)
	for _, r := range roles {
		name, _ := r.(string)
		arn, ok := roleByName[name]
		if !ok {
			return fmt.Errorf("policy %s: role %q is not in the template", id, name)
		}
		role := setup.Roles[arn]
		role.Statements = append(role.Statements, st...)
		setup.Roles[arn] = role
	}
	return nil
}

func addResourcePolicy(setup *iamcheck.Setup, id, arn string, doc any) error {
	if doc == nil {
		return nil
	}
	st, err := iamcheck.ParseDocument(id, doc)
	if err != nil {
		return err
	}
	setup.ResourcePolicies[arn] = append(setup.ResourcePolicies[arn], st...)
	return nil
}

// queueARN is the ARN of the provisioned queue whose URL (its Ref) is url.
func queueARN(res *resolver, url any) string {
	for _, p := range res.resources {
		if p.attrs["QueueUrl"] == url {
			arn, _ := p.attrs["Arn"].(string)
			return arn
		}
	}
	return ""
}

// tableKeys reads the partition key of a table and of each global secondary index.
func tableKeys(p map[string]any) iamcheck.TableKeys {
	hash := func(schema any) string {
		list, _ := schema.([]any)
		for _, k := range list {
			m, _ := k.(map[string]any)
			if m["KeyType"] == "HASH" {
				name, _ := m["AttributeName"].(string)
				return name
			}
		}
		return ""
	}
	keys := iamcheck.TableKeys{Partition: hash(p["KeySchema"]), Indexes: map[string]string{}}
	gsis, _ := p["GlobalSecondaryIndexes"].([]any)
	for _, g := range gsis {
		m, _ := g.(map[string]any)
		name, _ := m["IndexName"].(string)
		keys.Indexes[name] = hash(m["KeySchema"])
	}
	return keys
}
