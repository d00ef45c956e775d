package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Shell completion: scripts built from the command table, so that a new command or flag is
// completed without touching them. Each finds the group (the first word that is a group's
// name), then, in a group with verbs, the verb (the next word), and offers groups, verbs, or
// the command's flags (for a word starting with -).

func completionCmd(ctx context.Context, a *app, fs *flag.FlagSet, args []string) error {
	pos, err := a.parse(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr(fs, "name the shell: capacityctl completion bash|zsh|fish")
	}
	spec := completionSpec()
	switch pos[0] {
	case "bash":
		_, err = io.WriteString(a.io.out, spec.bash())
	case "zsh":
		_, err = io.WriteString(a.io.out, spec.zsh())
	case "fish":
		_, err = io.WriteString(a.io.out, spec.fish())
	default:
		return usageErr(fs, "completion for bash, zsh or fish, not %q", pos[0])
	}
	return err
}

// completions is what the scripts complete.
type completions struct {
	groups     []string            // every group, in help's order
	verbs      map[string][]string // a group with verbs: its verbs
	flags      map[string][]string // "group verb" (verb "" for a group without): its flags, --name
	args       map[string][]string // "group verb": its positional words (completion: the shells)
	globalOpts []string
}

// completionSpec reads every command's flags by running it with -h on an app that prints
// nothing and calls nothing: each command defines its flags, then parses before anything else.
func completionSpec() completions {
	c := completions{verbs: map[string][]string{}, flags: map[string][]string{},
		args: map[string][]string{"completion ": {"bash", "zsh", "fish"}}}
	for _, g := range groups {
		c.groups = append(c.groups, g.name)
	}
	quiet := &app{io: stdio{in: strings.NewReader(""), out: io.Discard, err: io.Discard}, getenv: func(string) string { return "" }, now: time.Now}
	global := flag.NewFlagSet("global", flag.ContinueOnError)
	quiet.globalFlags(global)
	global.VisitAll(func(f *flag.Flag) { c.globalOpts = append(c.globalOpts, dashes(f.Name)) })
	for _, cmd := range commands() {
		if cmd.verb != "" {
			c.verbs[cmd.group] = append(c.verbs[cmd.group], cmd.verb)
		}
		fs := flag.NewFlagSet(cmd.name(), flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		quiet.globalFlags(fs)
		_ = cmd.run(context.Background(), quiet, fs, []string{"-h"})
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, dashes(f.Name)) })
		sort.Strings(names)
		c.flags[cmd.group+" "+cmd.verb] = names
	}
	return c
}

// dashes is how a flag is written: -o, --output.
func dashes(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// verbGroups are the groups with verbs, space-separated.
func (c completions) verbGroups() string {
	var out []string
	for _, g := range c.groups {
		if len(c.verbs[g]) > 0 {
			out = append(out, g)
		}
	}
	return strings.Join(out, " ")
}

// keys are "group verb" in a stable order.
func (c completions) keys() []string {
	var out []string
	for k := range c.flags {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// shell is what the bash and the zsh scripts differ in; the rest is one script.
type shell struct {
	head, cur, words, first, tail string
}

var (
	bashShell = shell{
		head: "# bash completion for capacityctl: source <(capacityctl completion bash)\n",
		cur:  `${COMP_WORDS[COMP_CWORD]}`, words: `COMP_WORDS`, first: "1; i < COMP_CWORD",
		tail: `    COMPREPLY=($(compgen -W "$list" -- "$cur"))
}
complete -F _capacityctl capacityctl
`}
	zshShell = shell{
		head: "#compdef capacityctl\n# zsh completion for capacityctl: capacityctl completion zsh > \"${fpath[1]}/_capacityctl\"\n",
		cur:  `${words[CURRENT]}`, words: `words`, first: "2; i < CURRENT",
		tail: `    compadd -- ${=list}
}
if [[ "${funcstack[1]}" == "_capacityctl" ]]; then
    _capacityctl "$@"
else
    compdef _capacityctl capacityctl
fi
`}
)

func (c completions) bash() string { return c.script(bashShell) }
func (c completions) zsh() string  { return c.script(zshShell) }

func (c completions) script(sh shell) string {
	var b strings.Builder
	b.WriteString(sh.head)
	fmt.Fprintf(&b, `_capacityctl() {
    local cur="%s" group="" verb="" w="" list="" i
    for ((i = %s; i++)); do
        w="${%s[i]}"
        [[ "$w" == -* ]] && continue
        if [[ -z "$group" ]]; then
            case " %s " in (*" $w "*) group="$w" ;; esac
        elif [[ -z "$verb" ]]; then
            case " %s " in (*" $group "*) verb="$w" ;; esac
        fi
    done
    if [[ "$cur" == -* ]]; then
        case "$group $verb" in
`, sh.cur, sh.first, sh.words, strings.Join(c.groups, " "), c.verbGroups())
	for _, k := range c.keys() {
		fmt.Fprintf(&b, "            (%q) list=%q ;;\n", k, strings.Join(c.flags[k], " "))
	}
	fmt.Fprintf(&b, `            (*) list=%q ;;
        esac
    elif [[ -z "$group" ]]; then
        list=%q
    elif [[ -z "$verb" ]]; then
        case "$group" in
`, strings.Join(c.globalOpts, " "), strings.Join(c.groups, " "))
	for _, g := range c.groups {
		if v := c.verbs[g]; len(v) > 0 {
			fmt.Fprintf(&b, "            (%s) list=%q ;;\n", g, strings.Join(v, " "))
		}
	}
	for k, v := range c.args {
		fmt.Fprintf(&b, "            (%s) list=%q ;;\n", strings.TrimSpace(k), strings.Join(v, " "))
	}
	b.WriteString("        esac\n    fi\n")
	b.WriteString(sh.tail)
	return b.String()
}

func (c completions) fish() string {
	var b strings.Builder
	fmt.Fprintf(&b, `# fish completion for capacityctl: capacityctl completion fish > ~/.config/fish/completions/capacityctl.fish
function __capacityctl_at --description 'is the command line at this group and verb'
    set -l group ''
    set -l verb ''
    for w in (commandline -opc)[2..-1]
        if string match -q -- '-*' $w
            continue
        end
        if test -z "$group"
            if contains -- $w %s
                set group $w
            end
        else if test -z "$verb"
            if contains -- $group %s
                set verb $w
            end
        end
    end
    test "$group" = "$argv[1]"; and test "$verb" = "$argv[2]"
end
complete -c capacityctl -f
complete -c capacityctl -n "__capacityctl_at '' ''" -a %q
`, strings.Join(c.groups, " "), c.verbGroups(), strings.Join(c.groups, " "))
	for _, g := range c.groups {
		if v := c.verbs[g]; len(v) > 0 {
			fmt.Fprintf(&b, "complete -c capacityctl -n \"__capacityctl_at %s ''\" -a %q\n", g, strings.Join(v, " "))
		}
	}
	for k, v := range c.args {
		fmt.Fprintf(&b, "complete -c capacityctl -n \"__capacityctl_at %s ''\" -a %q\n", strings.TrimSpace(k), strings.Join(v, " "))
	}
	fishFlags(&b, "''", "", c.globalOpts)
	for _, k := range c.keys() {
		group, verb, _ := strings.Cut(k, " ")
		fishFlags(&b, group, verb, c.flags[k])
	}
	return b.String()
}

// fishFlags completes flags where the command line is at group and verb.
func fishFlags(b *strings.Builder, group, verb string, flags []string) {
	for _, f := range flags {
		opt := "-l " + strings.TrimPrefix(f, "--")
		if !strings.HasPrefix(f, "--") {
			opt = "-s " + strings.TrimPrefix(f, "-")
		}
		fmt.Fprintf(b, "complete -c capacityctl -n \"__capacityctl_at %s '%s'\" %s\n", group, verb, opt)
	}
}
