package main

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/openrelay/capacity/shared/emf"
	"github.com/openrelay/capacity/shared/emf/emftest"
)

// writtenDimensions runs the functions' metrics recorder through every kind of record and
// returns, by metric, the dimension names it writes (sorted), with env as their Environment.
func writtenDimensions(t *testing.T, env string) map[string][]string {
	t.Helper()
	var out bytes.Buffer
	emftest.WriteEveryKind(context.Background(), emf.New(&out, env))
	dims := map[string][]string{}
	for line := range strings.Lines(out.String()) {
		var rec struct {
			AWS struct {
				CloudWatchMetrics []struct {
					Dimensions [][]string
					Metrics    []struct{ Name string }
				}
			} `json:"_aws"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil || len(rec.AWS.CloudWatchMetrics) != 1 {
			t.Fatalf("metric line %s (%v)", line, err)
		}
		d := rec.AWS.CloudWatchMetrics[0]
		for _, m := range d.Metrics {
			dims[m.Name] = slices.Sorted(slices.Values(d.Dimensions[0]))
		}
	}
	return dims
}

// TestAlarmsQueryTheWrittenDimensions: CloudWatch matches a metric on its whole set of
// dimensions, so every alarm and dashboard search on the service's metrics names exactly the
// dimensions the functions write with that metric (emf), with the environment's value; an
// alarm on another set waits for data that never comes.
func TestAlarmsQueryTheWrittenDimensions(t *testing.T) {
	for _, env := range []string{"local", "prod"} {
		t.Run(env, func(t *testing.T) {
			written := writtenDimensions(t, env)
			tp := synth(t, env)
			alarms := 0
			for id, a := range tp.resources("AWS::CloudWatch::Alarm") {
				p := props(a)
				if p["Namespace"] != MetricsNamespace {
					continue
				}
				alarms++
				var names []string
				for _, d := range asList(p["Dimensions"]) {
					d := d.(map[string]any)
					names = append(names, d["Name"].(string))
					if d["Name"] == emf.DimensionEnvironment && d["Value"] != env {
						t.Errorf("alarm %s: %s=%v, want %s", id, emf.DimensionEnvironment, d["Value"], env)
					}
				}
				slices.Sort(names)
				if metric := p["MetricName"].(string); !reflect.DeepEqual(names, written[metric]) {
					t.Errorf("alarm %s on %s: dimensions %v, the functions write %v", id, metric, names, written[metric])
				}
			}
			if alarms == 0 {
				t.Fatalf("no alarm on %s", MetricsNamespace)
			}
			searches := 0
			for _, d := range tp.resources("AWS::CloudWatch::Dashboard") {
				body := flatten(t, props(d)["DashboardBody"])
				for _, m := range regexp.MustCompile(`SEARCH\('\{`+MetricsNamespace+`,([\w,]+)\} MetricName=\\"(\w+)\\" (\w+)=\\"(\w+)\\"`).FindAllStringSubmatch(body, -1) {
					searches++
					names := strings.Split(m[1], ",")
					slices.Sort(names)
					if !reflect.DeepEqual(names, written[m[2]]) || m[3] != emf.DimensionEnvironment || m[4] != env {
						t.Errorf("dashboard search of %s by %v where %s=%s; the functions write %v, with %s=%s",
							m[2], names, m[3], m[4], written[m[2]], emf.DimensionEnvironment, env)
					}
				}
			}
			if searches == 0 {
				t.Fatal("no dashboard search of the service's metrics")
			}
		})
	}
}
