package e2e

// The web console (docs/console.md) in a real browser, Debian's Chromium driven through the
// DevTools protocol (chromedp), against the local stack: every element is found by its
// visible label, role or text (XPath), or by the data-* hooks the console promises; every
// view is checked with axe-core and saved as a screenshot in docs/console/; and every request
// the page makes must go to the stack's own origin.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color/palette"
	"image/draw"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/openrelay/capacity/console"
	"github.com/openrelay/capacity/localstack/demo"
	"github.com/openrelay/capacity/shared/capacity"
	"github.com/openrelay/capacity/shared/dynamo"
	"github.com/openrelay/capacity/shared/routes"
)

// consoleURL is the console's page on the stack.
func consoleURL() string { return strings.TrimSuffix(apiURL, "/") + routes.ConsolePath + "/" }

// browserPath finds Debian's Chromium: chromium-headless-shell, else chromium. Without one the
// browser tests skip on a developer's machine and FAIL in CI (CI=true), where .ci/run installs it.
func browserPath(t testing.TB) string {
	for _, name := range []string{"chromium-headless-shell", "chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		if p := "/usr/bin/" + name; fileExists(p) {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Chromium (chromium-headless-shell or chromium): .ci/run installs it with apt-get")
	}
	t.Skip("no Chromium (chromium-headless-shell or chromium) on this machine: apt-get install chromium-headless-shell")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// browser is one headless Chromium with one tab, recording what the page asks for.
type browser struct {
	ctx      context.Context
	mu       sync.Mutex
	requests []string // every URL the page requested
	dialogs  []string // alert(), confirm()...: the console opens none
	errors   []string // uncaught exceptions
	bytes    float64  // bytes transferred (encoded) since the last resetWeight
}

// newBrowser starts Chromium with a fresh profile; flags keep it off the network it cannot reach.
func newBrowser(t testing.TB) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browserPath(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1100, 760),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	b := &browser{ctx: ctx}
	err := chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			b.requests = append(b.requests, ev.Request.URL)
		case *network.EventLoadingFinished:
			b.bytes += ev.EncodedDataLength
		case *page.EventJavascriptDialogOpening:
			b.dialogs = append(b.dialogs, ev.Message)
			go func() { _, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{}) }()
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := fmt.Sprintf("%s %s:%d", d.Text, d.URL, d.LineNumber)
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			b.errors = append(b.errors, msg)
		}
	})
	if err == nil {
		_, err = chromedp.Call(ctx, network.Enable, network.EnableParams{})
	}
	if err == nil {
		_, err = chromedp.Call(ctx, network.SetCacheDisabled, network.SetCacheDisabledParams{CacheDisabled: true})
	}
	if err != nil {
		cancelCtx()
		cancelAlloc()
		t.Fatalf("start Chromium: %v", err)
	}
	t.Cleanup(func() {
		b.checkOrigin(t)
		cancelCtx()
		cancelAlloc()
	})
	return b
}

// checkOrigin fails the test for any request to another origin than the stack's, any dialog
// and any uncaught exception.
func (b *browser) checkOrigin(t testing.TB) {
	t.Helper()
	own, err := url.Parse(consoleURL())
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.requests {
		u, err := url.Parse(r)
		if err != nil || (u.Scheme != "data" && u.Host != own.Host) || (u.Scheme != "data" && u.Scheme != own.Scheme) {
			t.Errorf("the page requested another origin: %s", r)
		}
	}
	if len(b.requests) == 0 {
		t.Error("no request recorded: the check of origins saw nothing")
	}
	if len(b.dialogs) > 0 {
		t.Errorf("the page opened dialogs: %q", b.dialogs)
	}
	if len(b.errors) > 0 {
		t.Errorf("uncaught exceptions in the page: %q", b.errors)
	}
}

func (b *browser) run(t testing.TB, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	b.runFor(t, what, 45*time.Second, actions...)
}

// runFor runs the actions, waiting at most d.
func (b *browser) runFor(t testing.TB, what string, d time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fail(t, what, err)
	}
}

// eval evaluates a JavaScript expression in the page and decodes its value.
func eval[T any](t testing.TB, b *browser, what, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 45*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		b.fail(t, what, err)
	}
	return v
}

// fail ends the test with the page's text, and its screenshot in the test's temporary folder.
func (b *browser) fail(t testing.TB, what string, err error) {
	t.Helper()
	if shot, _ := chromedp.Run(b.ctx, chromedp.CaptureScreenshot()); len(shot) > 0 {
		p := filepath.Join(os.TempDir(), fmt.Sprintf("console-failure-%d.png", time.Now().UnixNano()))
		_ = os.WriteFile(p, shot, 0o644)
		t.Logf("screenshot of the failure: %s", p)
	}
	text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
	t.Fatalf("%s: %v\npage text:\n%s", what, err, text)
}

// XPath selectors by what a person sees.
func byLabel(label string) string {
	return fmt.Sprintf(`//*[@id=//label[normalize-space(.)=%q]/@for]`, label)
}
func button(name string) string  { return fmt.Sprintf(`//button[normalize-space(.)=%q]`, name) }
func link(name string) string    { return fmt.Sprintf(`//a[normalize-space(.)=%q]`, name) }
func heading(text string) string { return fmt.Sprintf(`//h1[normalize-space(.)=%q]`, text) }
func textOn(text string) string  { return fmt.Sprintf(`//*[contains(normalize-space(.), %q)]`, text) }

// open loads the console in the browser and signs in with key.
func (b *browser) signIn(t testing.TB, key string) {
	t.Helper()
	b.run(t, "sign in",
		chromedp.Navigate(consoleURL()),
		chromedp.WaitVisible(heading("Sign in")),
		chromedp.SendKeys(byLabel("API key"), key),
		chromedp.Click(button("Sign in")),
	)
}

// axeResults collects each view's serious and critical violations (docs/console.md).
var (
	axeMu      sync.Mutex
	axeResults = map[string][]string{}
	axeSource  []byte
)

// checkAxe runs axe-core (node_modules/axe-core, pinned in package-lock.json) on the view as
// it is and fails on any serious or critical violation.
func (b *browser) checkAxe(t testing.TB, view string) {
	t.Helper()
	if axeSource == nil {
		src, err := os.ReadFile("../../node_modules/axe-core/axe.min.js")
		if err != nil {
			t.Fatalf("axe-core: %v (run `make node_modules`)", err)
		}
		axeSource = src
	}
	if !eval[bool](t, b, "axe present", `typeof axe !== 'undefined'`) {
		eval[int](t, b, "inject axe-core", string(axeSource)+";0")
	}
	violations := eval[[]string](t, b, "axe "+view, `axe.run(document, {resultTypes: ['violations']}).then(r => r.violations
		.filter(v => v.impact === 'serious' || v.impact === 'critical')
		.map(v => v.impact + ' ' + v.id + ': ' + v.help + ' (' + v.nodes.map(n => n.target.join(' ')).join(', ') + ')'))`,
		chromedp.EvalAwaitPromise)
	axeMu.Lock()
	axeResults[view] = violations
	axeMu.Unlock()
	for _, v := range violations {
		t.Errorf("axe, view %s: %s", view, v)
	}
	t.Logf("axe, view %s: %d serious or critical violations", view, len(violations))
}

// screenshotDir is where the tests save each view's screenshot: build/console unless
// CONSOLE_SCREENSHOTS names another folder. The committed ones in docs/console are refreshed
// with CONSOLE_SCREENSHOTS=docs/console (docs/console.md), so that make test leaves the tree alone.
func screenshotDir(t testing.TB) string {
	dir := filepath.Join("..", "..", "build", "console")
	if d := os.Getenv("CONSOLE_SCREENSHOTS"); d != "" {
		dir = filepath.Join("..", "..", d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// screenshot saves the view as <screenshotDir>/<name>.png, in the 216 web-safe colours (a quarter of the bytes).
func (b *browser) screenshot(t testing.TB, name string) {
	t.Helper()
	shot, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	small := image.NewPaletted(img.Bounds(), palette.WebSafe)
	draw.Draw(small, img.Bounds(), img, image.Point{}, draw.Src) // nearest colour: flat UI colours, no dithering noise
	var out bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&out, small); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(screenshotDir(t), name+".png"), out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// view checks a view with axe and saves its screenshot.
func (b *browser) view(t testing.TB, name string) {
	t.Helper()
	b.checkAxe(t, name)
	b.screenshot(t, name)
}

var nodeAOnce sync.Once

// seedNodeA puts the demo's node-a as `make run` has it (a stack started by `make run`
// already has it).
func seedNodeA(t testing.TB) string {
	t.Helper()
	var err error
	nodeAOnce.Do(func() {
		w := demo.Seed(time.Now())
		w.Keys = nil
		w.Nodes[0].AgentEndpoint = agents.Endpoint(demo.NodeID)
		err = store.Put(context.Background(), w)
		var ccf *types.ConditionalCheckFailedException
		var tce *types.TransactionCanceledException
		if errors.As(err, &ccf) || errors.As(err, &tce) {
			err = nil // already there
		}
		for _, vm := range w.VMs {
			if err == nil {
				err = agents.AddVM(demo.NodeID, vm.ID, string(vm.State))
			}
		}
	})
	if err != nil {
		t.Fatalf("seed node-a: %v", err)
	}
	return demo.NodeID
}

// unitStates reads the unit map's cells: unit id -> data-state.
func (b *browser) unitStates(t testing.TB) map[string]string {
	t.Helper()
	return eval[map[string]string](t, b, "read the unit map", `Object.fromEntries([...document.querySelectorAll('main [data-unit-id]')].map(e => [e.dataset.unitId, e.dataset.state]))`)
}

// The demo node as the owner sees it: node-a's 8 units with the demo's states, then gpu-2
// reclaimed through the page, vm-spot-1 seen terminated, and the audit record with the reason.
func TestConsoleOwnerReclaimsGPU2(t *testing.T) {
	node := seedNodeA(t)
	b := newBrowser(t)
	b.signIn(t, keyOwner)
	b.run(t, "nodes list", chromedp.WaitVisible(heading("Nodes")))
	// Other tests' nodes may come first: page on until node-a is listed.
	rowA := `//tr[td/a[normalize-space(.)="node-a"]]//*[@role="img"]`
	for range 40 {
		if b.exists(t, rowA) {
			break
		}
		time.Sleep(250 * time.Millisecond)
		switch {
		case b.exists(t, button("More nodes")):
			b.run(t, "more nodes", chromedp.Click(button("More nodes")))
		case eval[bool](t, b, "loading?", `document.body.innerText.includes('loading')`):
		default: // the list reads an index, which may lag a moment behind the seed
			b.run(t, "reload", chromedp.Reload(), chromedp.WaitVisible(heading("Nodes")))
		}
	}
	b.run(t, "node-a listed", chromedp.WaitVisible(rowA))
	b.view(t, "nodes")

	b.run(t, "open node-a", chromedp.Click(link(node)),
		chromedp.WaitVisible(heading("Node "+node)), chromedp.WaitVisible(`//main//*[@data-unit-id="gpu-7"]`))
	want := map[string]string{
		"gpu-0": "occupied", "gpu-1": "exclusive", "gpu-2": "spot", "gpu-3": "spot",
		"gpu-4": "released", "gpu-5": "released", "gpu-6": "spot", "gpu-7": "occupied",
	}
	if got := b.unitStates(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("unit map %v, want %v", got, want)
	}
	vms := eval[map[string]string](t, b, "VMs", `Object.fromEntries([...document.querySelectorAll('main [data-vm-id]')].map(e => [e.dataset.vmId, e.dataset.vmState]))`)
	for _, vm := range []string{"vm-spot-1", "vm-spot-2", "vm-res-1", "vm-od-1"} {
		if vms[vm] != "running" {
			t.Errorf("VM %s shown %q, want running (all: %v)", vm, vms[vm], vms)
		}
	}
	b.view(t, "node")

	b.run(t, "preview gpu-2",
		chromedp.Click(byLabel("Select gpu-2")),
		chromedp.SendKeys(byLabel("Grace seconds"), "6"),
		chromedp.Click(button("Preview reclaim")),
		chromedp.WaitVisible(`//*[@aria-label="Reclaim preview"]//li[contains(., "VMs to terminate: vm-spot-1")]`),
	)
	b.view(t, "preview")
	b.run(t, "reclaim gpu-2",
		chromedp.SendKeys(byLabel("Reason"), "training run"),
		chromedp.Click(button("Reclaim")),
		chromedp.WaitVisible(`//h1[starts-with(normalize-space(.), "Reclaim ")]`),
		chromedp.WaitVisible(textOn("s before termination")),
	)
	b.view(t, "operation-grace")
	b.run(t, "vm-spot-1 terminated", chromedp.WaitVisible(`//tr[@data-vm-id="vm-spot-1" and @data-vm-state="terminated"]`),
		chromedp.WaitVisible(`//*[@data-op-state="completed"]`))
	b.view(t, "operation")

	b.run(t, "reservation view", chromedp.Click(link("res-1")),
		chromedp.WaitVisible(heading("Reservation res-1")),
		chromedp.WaitVisible(`//tr[td[normalize-space(.)="training run"] and td[contains(., "reclaim") and not(contains(., "dry run"))]]`),
		chromedp.WaitVisible(textOn("Chain verify: all")),
	)
	b.view(t, "reservation")

	b.run(t, "sign out", chromedp.Click(button("Sign out")), chromedp.WaitVisible(heading("Sign in")))
	stored := eval[string](t, b, "key forgotten", `JSON.stringify(sessionStorage) + JSON.stringify(localStorage) + document.cookie + location.href`)
	if strings.Contains(stored, "ocap_") {
		t.Errorf("the key outlived sign-out: %s", stored)
	}
}

// A reason that is markup is shown as those characters and runs nothing.
func TestConsoleShowsHostileReasonAsText(t *testing.T) {
	node := newNode(t, nil)
	const hostile = `<img src=x onerror=alert(1)>`
	b := newBrowser(t)
	b.signIn(t, keyOwner)
	b.run(t, "reclaim with a hostile reason",
		chromedp.Navigate(consoleURL()+"#/nodes/"+node),
		chromedp.WaitVisible(heading("Node "+node)),
		chromedp.Click(byLabel("Select gpu-2")),
		chromedp.SendKeys(byLabel("Reason"), hostile),
		chromedp.Click(button("Preview reclaim")),
		chromedp.WaitVisible(button("Reclaim")),
		chromedp.Click(button("Reclaim")),
		chromedp.WaitVisible(`//h1[starts-with(normalize-space(.), "Reclaim ")]`),
		chromedp.Navigate(consoleURL()+"#/nodes/"+node+"/reservations/res-1"),
		chromedp.WaitVisible(heading("Reservation res-1")),
	)
	var shown []string
	var imgs int
	deadline := time.Now().Add(20 * time.Second)
	for { // the audit index may lag a moment
		shown = eval[[]string](t, b, "audit reasons", `[...document.querySelectorAll('[data-testid="audit-reason"]')].map(e => e.textContent)`)
		imgs = eval[int](t, b, "images", `document.querySelectorAll('img').length`)
		if slices.Contains(shown, hostile) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
		b.run(t, "reload", chromedp.Reload(), chromedp.WaitVisible(heading("Reservation res-1")))
	}
	if !slices.Contains(shown, hostile) {
		t.Errorf("audit reasons %q, want the literal %q", shown, hostile)
	}
	if imgs != 0 {
		t.Errorf("%d img elements in the page: the reason became markup", imgs)
	}
	b.view(t, "hostile-reason")
}

// A junk key returns to sign-in with the problem's detail, and is forgotten.
func TestConsoleJunkKey(t *testing.T) {
	b := newBrowser(t)
	b.signIn(t, "ocap_junk")
	b.run(t, "refused", chromedp.WaitVisible(`//div[@role="alert"]`), chromedp.WaitVisible(heading("Sign in")))
	alert := eval[string](t, b, "alert", `document.querySelector('[role="alert"]').textContent`)
	stored := eval[string](t, b, "storage", `JSON.stringify(sessionStorage)`)
	if alert == "" || strings.Contains(stored, "ocap_junk") {
		t.Errorf("alert %q, storage %s", alert, stored)
	}
	b.view(t, "sign-in-refused")
}

// The audience sees the units of its reservation but is offered no reclaim (the API would
// answer 403), nor operator pages.
func TestConsoleAudienceMayNotReclaim(t *testing.T) {
	_, b := openNode(t, keyAudience)
	controls := eval[int](t, b, "controls", `[...document.querySelectorAll('button, input')].filter(e => /Preview reclaim|^Reclaim$/.test(e.textContent) || (e.labels && [...e.labels].some(l => /^Select |^Reason$/.test(l.textContent)))).length
		+ [...document.querySelectorAll('a')].filter(a => /API keys|Register a node/.test(a.textContent)).length`)
	if controls != 0 {
		t.Errorf("%d reclaim or operator controls offered to the audience", controls)
	}
	if got := b.unitStates(t); len(got) == 0 || got["gpu-7"] != "" {
		t.Errorf("audience sees units %v: want its reservation's units only (not gpu-7)", got)
	}
	b.view(t, "audience")
}

// openNode seeds a fresh copy of the demo node, signs in with key and opens the node's view.
func openNode(t *testing.T, key string) (string, *browser) {
	t.Helper()
	node := newNode(t, nil)
	b := newBrowser(t)
	b.signIn(t, key)
	b.run(t, "node view", chromedp.Navigate(consoleURL()+"#/nodes/"+node),
		chromedp.WaitVisible(heading("Node "+node)), chromedp.WaitVisible(`//main//*[@data-unit-id="gpu-2"]`))
	return node, b
}

// exists reports whether the XPath names an element of the page now.
func (b *browser) exists(t testing.TB, sel string) bool {
	t.Helper()
	return eval[bool](t, b, "exists "+sel, fmt.Sprintf(`!!document.evaluate(%q, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue`, sel))
}

// tabTo presses Tab until the focused element is the one the XPath names (at most 80 times).
func (b *browser) tabTo(t testing.TB, sel string) {
	t.Helper()
	for range 80 {
		if eval[bool](t, b, "focus?", fmt.Sprintf(`document.evaluate(%q, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue === document.activeElement`, sel)) {
			return
		}
		b.run(t, "Tab", chromedp.KeyEvent("\t"))
	}
	t.Fatalf("Tab never reached %s", sel)
}

// The whole reclaim flow by keyboard alone: Tab, Space, typing and Enter.
func TestConsoleReclaimByKeyboard(t *testing.T) {
	node := newNode(t, nil)
	b := newBrowser(t)
	b.run(t, "open", chromedp.Navigate(consoleURL()+"#/nodes/"+node), chromedp.WaitVisible(heading("Sign in")))
	b.tabTo(t, byLabel("API key"))
	b.run(t, "type the key", chromedp.KeyEvent(keyManager), chromedp.KeyEvent("\r"),
		chromedp.WaitVisible(heading("Node "+node)))
	b.tabTo(t, byLabel("Select gpu-3"))
	b.run(t, "select", chromedp.KeyEvent(" "))
	b.tabTo(t, byLabel("Reason"))
	b.run(t, "reason", chromedp.KeyEvent("keyboard only"))
	b.tabTo(t, button("Preview reclaim"))
	b.run(t, "preview", chromedp.KeyEvent("\r"),
		chromedp.WaitVisible(`//*[@aria-label="Reclaim preview"]//li[contains(., "VMs to terminate: vm-spot-2")]`))
	b.tabTo(t, button("Reclaim"))
	b.run(t, "reclaim", chromedp.KeyEvent("\r"),
		chromedp.WaitVisible(`//tr[@data-vm-id="vm-spot-2" and @data-vm-state="terminated"]`))
	b.checkAxe(t, "operation (keyboard)")
}

// An operator key is offered the operator pages: a key made (its secret shown once) and revoked.
func TestConsoleOperatorKeys(t *testing.T) {
	b := newBrowser(t)
	b.signIn(t, keyOperator)
	org := fmt.Sprintf("org-console-%d", time.Now().UnixNano()%1e9)
	b.run(t, "keys", chromedp.WaitVisible(link("API keys")), chromedp.Click(link("API keys")),
		chromedp.WaitVisible(heading("API keys")),
		chromedp.SendKeys(byLabel("Org id"), org),
		chromedp.Click(byLabel("reservation.read")),
		chromedp.Click(button("Create key")),
		chromedp.WaitVisible(textOn("shown once")),
		chromedp.WaitVisible(`//tr[td[normalize-space(.)=`+fmt.Sprintf("%q", org)+`]]//button[normalize-space(.)="Revoke"]`),
	)
	b.view(t, "keys")
	b.run(t, "revoke", chromedp.Click(`//tr[td[normalize-space(.)=`+fmt.Sprintf("%q", org)+`]]//button[normalize-space(.)="Revoke"]`),
		chromedp.WaitVisible(`//tr[td[normalize-space(.)=`+fmt.Sprintf("%q", org)+`] and td[normalize-space(.)="revoked"]]`))
	b.run(t, "registration", chromedp.Click(link("Register a node")), chromedp.WaitVisible(heading("Register a node")))
	b.view(t, "register")
	// The key-management chain now holds the key just made and revoked; the page verifies it.
	b.run(t, "audit chains", chromedp.Click(link("Audit chains")), chromedp.WaitVisible(heading("Audit chain of API keys")),
		chromedp.WaitVisible(textOn("Chain verify: all")))
	b.view(t, "audit-chain")
}

// A plan that changed between the preview and the reclaim: the 412 shows the new plan, which
// is then sent.
func TestConsolePlanChanged(t *testing.T) {
	node, b := openNode(t, keyOwner)
	b.run(t, "preview",
		chromedp.Click(byLabel("Select gpu-2")),
		chromedp.Click(button("Preview reclaim")),
		chromedp.WaitVisible(button("Reclaim")))
	// Meanwhile the reservation changes: gpu-1 goes to the spot market.
	if r := call(t, "POST", releasePath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-1"}}); r.Status != http.StatusOK {
		t.Fatalf("release: %d %s", r.Status, r.Body)
	}
	b.run(t, "412", chromedp.Click(button("Reclaim")),
		chromedp.WaitVisible(`//*[@role="alert"][contains(., "plan_changed")]`),
		chromedp.WaitVisible(`//*[@aria-label="Reclaim preview"]//li[contains(., "VMs to terminate: vm-spot-1")]`))
	b.view(t, "plan-changed")
	b.run(t, "the new plan", chromedp.Click(button("Reclaim")),
		chromedp.WaitVisible(`//tr[@data-vm-id="vm-spot-1"]`))
}

// A scheduled reclaim, made through the API, is cancelled from the reservation's page.
func TestConsoleCancelsScheduledReclaim(t *testing.T) {
	node := newNode(t, nil)
	at := time.Now().UTC().Add(time.Hour).Truncate(time.Second).Format(time.RFC3339)
	r := call(t, http.MethodPost, reclaimPath(node), keyOwner, map[string]any{"unitIds": []string{"gpu-2"}, "at": at, "reason": "tonight's run"})
	if r.Status != http.StatusAccepted {
		t.Fatalf("schedule: %d %s", r.Status, r.Body)
	}
	b := newBrowser(t)
	b.signIn(t, keyOwner)
	row := `//tr[td[normalize-space(.)="tonight's run"]]`
	b.run(t, "reservation", chromedp.Navigate(consoleURL()+"#/nodes/"+node+"/reservations/res-1"),
		chromedp.WaitVisible(heading("Reservation res-1")))
	for range 20 { // the list reads an index, which may lag a moment
		if b.exists(t, row) {
			break
		}
		time.Sleep(500 * time.Millisecond)
		b.run(t, "reload", chromedp.Reload(), chromedp.WaitVisible(heading("Reservation res-1")))
	}
	b.run(t, "cancel", chromedp.Click(row+`//button[normalize-space(.)="Cancel"]`),
		chromedp.WaitVisible(row+`[td[normalize-space(.)="cancelled"]]`))
	b.view(t, "scheduled-cancelled")
}

// A count, not units: the preview comes from reclaim-plan and names the units it chose.
func TestConsoleReclaimByCount(t *testing.T) {
	_, b := openNode(t, keyManager)
	b.run(t, "count",
		chromedp.SendKeys(byLabel("Count"), "2"),
		chromedp.Click(button("Preview reclaim")),
		chromedp.WaitVisible(`//*[@aria-label="Reclaim preview"][contains(., "of a reclaim of gpu-")]`),
		chromedp.WaitVisible(button("Reclaim")))
	b.checkAxe(t, "preview (count)")
}

// A VM whose agent refuses to terminate it fails the operation; once the agent is mended,
// the page's re-drive terminates it.
func TestConsoleRedrivesAFailedTermination(t *testing.T) {
	node := newNode(t, nil)
	agents.FailAlways(node, "vm-spot-1", true)
	b := newBrowser(t)
	b.signIn(t, keyOwner)
	b.run(t, "reclaim", chromedp.Navigate(consoleURL()+"#/nodes/"+node),
		chromedp.WaitVisible(heading("Node "+node)),
		chromedp.Click(byLabel("Select gpu-2")),
		chromedp.Click(button("Preview reclaim")),
		chromedp.Click(button("Reclaim")),
		chromedp.WaitVisible(`//h1[starts-with(normalize-space(.), "Reclaim ")]`))
	b.runFor(t, "failed", 2*time.Minute, chromedp.WaitVisible(`//*[@data-op-state="failed"]`),
		chromedp.WaitVisible(`//tr[@data-vm-id="vm-spot-1" and @data-vm-state="failed"]`))
	b.view(t, "operation-failed")
	agents.FailAlways(node, "vm-spot-1", false)
	b.runFor(t, "re-drive", 2*time.Minute, chromedp.Click(button("Re-drive the termination")),
		chromedp.WaitVisible(`//tr[@data-vm-id="vm-spot-1" and @data-vm-state="terminated"]`))
}

// The console's own answers through API Gateway: the page, the redirect to it, the headers.
func TestConsoleServedWithSecurityHeaders(t *testing.T) {
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/", http.StatusOK},
		{"/app.js", http.StatusOK},
		{"/vendor/preact.mjs", http.StatusOK},
		{"/missing.js", http.StatusNotFound},
	} {
		resp, err := noFollow.Get(strings.TrimSuffix(consoleURL(), "/") + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.path, resp.StatusCode, tc.status)
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != console.ContentSecurityPolicy {
			t.Errorf("%s: CSP %q", tc.path, got)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s: headers %v", tc.path, resp.Header)
		}
	}
	resp, err := noFollow.Get(strings.TrimSuffix(consoleURL(), "/"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "console/" {
		t.Errorf("bare path: %d to %q, want 301 to console/", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// consoleWeightLimit is the most the node view may transfer, page and API answers together.
const consoleWeightLimit = 150 * 1024

// BenchmarkConsoleNodeView: a cold load of the node view of a node of 64 units (48 reserved,
// 40 of them released, 34 VMs), from navigation to the 64 cells drawn, cache disabled; and the
// bytes it transferred (page, libraries and API answers), which must stay under 150 KB.
func BenchmarkConsoleNodeView(b *testing.B) {
	node := newNode(b, func(w *dynamo.Seed) {
		w.Nodes[0].UnitIDs = unitIDs(64)
		w.Reservations[0].ReservedUnitIDs = unitIDs(48)
		w.Reservations[0].ReleasedUnitIDs = unitIDs(48)[8:]
		base := w.VMs[0]
		for i := 8; i < 40; i++ {
			vm := base
			vm.ID, vm.UnitIDs = fmt.Sprintf("vm-spot-b%d", i), []string{fmt.Sprintf("gpu-%d", i)}
			w.VMs = append(w.VMs, vm)
		}
		// The demo's VMs on gpu-2, gpu-3, gpu-6: keep only those on other units.
		w.VMs = slices.DeleteFunc(w.VMs, func(v capacity.VM) bool {
			return v.ID == "vm-spot-1" || v.ID == "vm-spot-2"
		})
	})
	br := newBrowser(b)
	br.signIn(b, keyOwner)
	br.run(b, "signed in", chromedp.WaitVisible(heading("Nodes")))
	var total time.Duration
	var weight float64
	b.ResetTimer()
	for range b.N {
		br.run(b, "blank", chromedp.Navigate("about:blank"))
		br.mu.Lock()
		br.bytes = 0
		br.mu.Unlock()
		start := time.Now()
		br.run(b, "node view",
			chromedp.Navigate(consoleURL()+"#/nodes/"+node),
			chromedp.Poll[chromedp.Void](`document.querySelectorAll('main .map [data-unit-id]').length === 64`, chromedp.WithPollingInterval(5*time.Millisecond)))
		total += time.Since(start)
		time.Sleep(200 * time.Millisecond) // the last LoadingFinished events
		br.mu.Lock()
		weight = br.bytes
		br.mu.Unlock()
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/view")
	b.ReportMetric(weight/1024, "KB/view")
	b.ReportMetric(0, "ns/op")
	if weight > consoleWeightLimit {
		b.Errorf("the node view transferred %.0f bytes, over %d", weight, consoleWeightLimit)
	}
	if weight == 0 {
		b.Error("no bytes counted")
	}
}

// operatorKeyWith creates, with the demo operator key and through the API, an operator key of
// the operator's org holding only perms, and returns its secret.
func operatorKeyWith(t *testing.T, perms ...string) string {
	t.Helper()
	res := call(t, http.MethodPost, "/v1/keys", keyOperator, map[string]any{"orgId": demo.OrgPlatform, "operator": true,
		"permissions": perms, "description": "console test: " + strings.Join(perms, ",")}, "Idempotency-Key", fmt.Sprintf("console-key-%d", time.Now().UnixNano()))
	if res.Status != http.StatusCreated {
		t.Fatalf("create a key with %v: %d %s", perms, res.Status, res.Body)
	}
	secret, _ := res.json(t)["secret"].(string)
	if secret == "" {
		t.Fatalf("no secret in %s", res.Body)
	}
	return secret
}

// operatorLinks is the operator pages the header offers, by their link text.
func (b *browser) operatorLinks(t testing.TB) []string {
	t.Helper()
	return eval[[]string](t, b, "operator links", `[...document.querySelectorAll('header nav a')].map(a => a.textContent.trim()).filter(s => s !== 'Nodes')`)
}

// A key with only node.manage is offered node registration and agent-key rotation (and not
// API keys or audit chains): it registers a node through the page, its agent key shown once,
// then rotates that key through the page.
func TestConsoleNodeManagerRegistersAndRotates(t *testing.T) {
	secret := operatorKeyWith(t, capacity.PermNodeManage)
	b := newBrowser(t)
	b.signIn(t, secret)
	b.run(t, "signed in", chromedp.WaitVisible(heading("Nodes")), chromedp.WaitVisible(link("Register a node")))
	if got := b.operatorLinks(t); !slices.Equal(got, []string{"Register a node"}) {
		t.Errorf("operator pages offered %v, want only [Register a node]", got)
	}
	node := fmt.Sprintf("node-console-%d", time.Now().UnixNano()%1e9)
	b.run(t, "register", chromedp.Click(link("Register a node")), chromedp.WaitVisible(heading("Register a node")),
		chromedp.SendKeys(byLabel("Node id"), node),
		chromedp.SendKeys(byLabel("Owner org id"), demo.OrgOwner),
		chromedp.SendKeys(byLabel("Unit ids (comma or space separated)"), "gpu-0, gpu-1"),
		chromedp.SendKeys(byLabel("Agent endpoint"), agents.Endpoint(node)),
		chromedp.SendKeys(byLabel("Reason"), "console test"),
		chromedp.Click(button("Register")),
		chromedp.WaitVisible(textOn("Node "+node+" registered")),
	)
	agentKey := eval[string](t, b, "agent key", `[...document.querySelectorAll('[role="status"]')].filter(e => e.textContent.includes('Agent key')).map(e => e.querySelector('.secret').textContent).join('')`)
	if len(agentKey) < 32 {
		t.Errorf("agent key shown %q, want the key once", agentKey)
	}
	b.view(t, "register-node")
	got := call(t, http.MethodGet, "/v1/nodes/"+node, keyOperator, nil)
	if got.Status != http.StatusOK {
		t.Fatalf("the registered node: %d %s", got.Status, got.Body)
	}
	gen := got.json(t)["node"].(map[string]any)["agentKeyGen"]

	b.run(t, "node view", chromedp.Click(link(node)), chromedp.WaitVisible(heading("Node "+node)),
		chromedp.WaitVisible(`//main//*[@data-unit-id="gpu-1" and @data-state="unreserved"]`),
		chromedp.Click(button("Rotate agent key")),
		chromedp.WaitVisible(textOn("New agent key")),
	)
	rotated := eval[string](t, b, "new agent key", `document.querySelector('[aria-label="Node agent key"] .secret').textContent`)
	if len(rotated) < 32 || rotated == agentKey {
		t.Errorf("new agent key %q (first %q): want a new key shown once", rotated, agentKey)
	}
	after := call(t, http.MethodGet, "/v1/nodes/"+node, keyOperator, nil).json(t)["node"].(map[string]any)["agentKeyGen"]
	if g0, g1 := gen.(float64), after.(float64); g1 != g0+1 {
		t.Errorf("agentKeyGen %v after the rotation, want %v", g1, g0+1)
	}
	b.view(t, "rotate-agent-key")
}

// A key with only reservation.read (an operator's, so it sees every node) is offered none of
// the operator controls, and an operator page opened by its address says so.
func TestConsoleReadOnlyKeyOffersNoOperatorControls(t *testing.T) {
	node := newNode(t, nil)
	secret := operatorKeyWith(t, capacity.PermRead)
	b := newBrowser(t)
	b.signIn(t, secret)
	b.run(t, "node view", chromedp.WaitVisible(heading("Nodes")), chromedp.Navigate(consoleURL()+"#/nodes/"+node),
		chromedp.WaitVisible(heading("Node "+node)), chromedp.WaitVisible(`//main//*[@data-unit-id="gpu-2"]`))
	if got := b.operatorLinks(t); len(got) != 0 {
		t.Errorf("operator pages offered %v to a reservation.read key", got)
	}
	// Reclaim controls follow the unit view's access, not this test's concern.
	for _, sel := range []string{button("Rotate agent key"), textOn("Audit chain of")} {
		if b.exists(t, sel) {
			t.Errorf("%s offered to a reservation.read key", sel)
		}
	}
	b.view(t, "read-only")
	for _, page := range []struct{ hash, title string }{{"#/keys", "API keys"}, {"#/register", "Register a node"}, {"#/audit", "Audit chains"}} {
		b.run(t, page.hash, chromedp.Navigate(consoleURL()+page.hash), chromedp.WaitVisible(heading(page.title)),
			chromedp.WaitVisible(textOn("is not offered")))
		if b.exists(t, button("Create key")) || b.exists(t, button("Register")) {
			t.Errorf("%s: a form offered to a reservation.read key", page.hash)
		}
	}
}
