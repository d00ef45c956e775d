package cost

import (
	"fmt"
	"slices"
	"strings"
)

// Design column: a design's bills at each grace.
type Column struct {
	Title string
	Bills []Bill // one per case, in the order of the table's cases
}

func money(usdPerReclaim float64) string {
	m := usdPerReclaim * 1e6
	switch {
	case m == 0:
		return "$0"
	case m < 0.01:
		return "<$0.01"
	}
	return fmt.Sprintf("$%.2f", m)
}

func graceTitle(c Case) string {
	return fmt.Sprintf("grace %d s", c.GraceSeconds)
}

// Markdown renders the cost section: the services side by side for each design (today's
// snapshot, then the template of the day when it differs), every line of the current
// design with its quantity per reclaim, and the prices.
func Markdown(cols []Column, p Prices, a Assumptions) string {
	var b strings.Builder
	cur := cols[len(cols)-1]

	b.WriteString("| $ per million typical reclaims |")
	for _, c := range cols {
		for _, bill := range c.Bills {
			fmt.Fprintf(&b, " %s, %s |", c.Title, graceTitle(bill.Case))
		}
	}
	b.WriteString("\n|---|")
	for _, c := range cols {
		b.WriteString(strings.Repeat("---:|", len(c.Bills)))
	}
	b.WriteString("\n")
	for _, s := range Services {
		any := false
		for _, c := range cols {
			for _, bill := range c.Bills {
				if _, ok := bill.ByService()[s]; ok {
					any = true
				}
			}
		}
		if !any {
			continue
		}
		fmt.Fprintf(&b, "| %s |", s)
		for _, c := range cols {
			for _, bill := range c.Bills {
				fmt.Fprintf(&b, " %s |", money(bill.ByService()[s]))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("| **total** |")
	for _, c := range cols {
		for _, bill := range c.Bills {
			fmt.Fprintf(&b, " **%s** |", money(bill.Total()))
		}
	}
	b.WriteString("\n\n")

	fmt.Fprintf(&b, "%s, line by line (quantities per reclaim):\n\n", cur.Title)
	b.WriteString("| service | what | ")
	for _, bill := range cur.Bills {
		fmt.Fprintf(&b, "%s: per reclaim | $ per million |", graceTitle(bill.Case))
	}
	b.WriteString("\n|---|---|")
	b.WriteString(strings.Repeat("---|---:|", len(cur.Bills)))
	b.WriteString("\n")
	type key struct{ service, what string }
	var keys []key
	for _, bill := range cur.Bills {
		for _, l := range bill.Lines {
			if k := (key{l.Service, l.What}); !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.SortStableFunc(keys, func(x, y key) int { return slices.Index(Services, x.service) - slices.Index(Services, y.service) })
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %s |", k.service, k.what)
		for _, bill := range cur.Bills {
			i := slices.IndexFunc(bill.Lines, func(l Line) bool { return l.Service == k.service && l.What == k.what })
			if i < 0 {
				b.WriteString(" | |")
				continue
			}
			fmt.Fprintf(&b, " %s | %s |", bill.Lines[i].Quantity, money(bill.Lines[i].USD))
		}
		b.WriteString("\n")
	}

	fmt.Fprintf(&b, "\nPrices (%s, list prices, no free tier, first tier):\n\n| item | USD | per | page |\n|---|---:|---|---|\n", p.Region)
	for _, row := range []struct {
		name string
		pr   UnitPrice
	}{
		{"API Gateway REST", p.APIGatewayREST}, {"Lambda requests", p.LambdaRequest}, {"Lambda duration, arm64", p.LambdaGBsArm},
		{"Lambda duration, x86_64", p.LambdaGBsX86}, {"Step Functions Standard", p.SFNTransition},
		{"Step Functions Express requests", p.SFNExpressReq}, {"Step Functions Express duration", p.SFNExpressGBs},
		{"DynamoDB on-demand writes", p.DynamoWRU}, {"DynamoDB on-demand reads", p.DynamoRRU}, {"DynamoDB storage", p.DynamoStorage},
		{"DynamoDB Standard-IA writes", p.DynamoWRUIA}, {"DynamoDB Standard-IA reads", p.DynamoRRUIA}, {"DynamoDB Standard-IA storage", p.DynamoStorageIA},
		{"DynamoDB point-in-time recovery", p.DynamoPITR}, {"EventBridge custom events", p.EventBridgeEvent},
		{"EventBridge Scheduler", p.SchedulerInvoke}, {"SQS", p.SQSRequest}, {"KMS", p.KMSRequest},
		{"CloudWatch Logs ingestion", p.LogsIngest}, {"CloudWatch Logs, vended logs", p.LogsVendedIngest},
		{"CloudWatch Logs storage", p.LogsStorage}, {"X-Ray", p.XRayTrace},
	} {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", row.name, usd(row.pr.USD), row.pr.Unit, row.pr.Source)
	}

	fmt.Fprintf(&b, "\nAssumed (neither the template nor the benchmark says): function time per invocation %s ms "+
		"(the API call and TerminateNode measured on the local stack, docs/numbers.md; the others guessed); "+
		"log bytes per invocation %s plus %d B of Lambda's own lines where its system log level lets them through; a Step Functions log event %d B, plus %d B of state data when the log includes it; "+
		"X-Ray records %g%% of traces (its default rule past one a second); items without a TTL stored %g months; "+
		"an Express execution spends %g ms in each state beside its tasks' functions and is billed at %d MB; "+
		"a queue's event source mapping receives %g message a batch; "+
		"a node's agent key costs a KMS Decrypt once per key generation (its first open after a rotation; every later open, in any instance, opens the form terminate-node resealed under the agent master secret): %g per reclaim; "+
		"a typical run: %s.\n",
		kv(a.DurationMS), kvInt(a.AppLogBytes), a.PlatformLogBytes, a.StateLogEnvelope, a.StateDataBytes,
		a.XRaySampled*100, a.KeptForGoodMonths, a.ExpressStateMS, a.ExpressMemoryMB, a.QueueBatch, a.AgentKeyDecrypts, runText(a))
	return b.String()
}

func usd(v float64) string {
	s := fmt.Sprintf("%.10f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

func kv(m map[string]float64) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %g", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func kvInt(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func runText(a Assumptions) string {
	var runs []string
	for i, title := range []string{"the execution the API starts", "the next one (its consumer starts it when the queued step is due)"} {
		r := a.Run(Case{GraceSeconds: -1}, i)
		var parts []string
		for _, k := range sortedKeys(r) {
			v := fmt.Sprint(r[k])
			if r[k] == float64(-1) {
				v = "the grace, in seconds"
			}
			parts = append(parts, fmt.Sprintf("`%s` = %s", k, v))
		}
		runs = append(runs, title+": "+strings.Join(parts, ", "))
	}
	return strings.Join(runs, "; ")
}
