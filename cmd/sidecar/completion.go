package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func init() {
	register("completion", command{summary: "print a shell completion script (completion bash|zsh)",
		usage: `usage: sidecar completion bash|zsh

bash: source <(sidecar completion bash)   (or save it in /etc/bash_completion.d/sidecar)
zsh:  source <(sidecar completion zsh)    (or save it as _sidecar in a directory of $fpath)`,
		subs: []string{"bash", "zsh"}, run: runCompletion})
}

func runCompletion(_ context.Context, args []string) error {
	if len(args) > 0 && isHelpArg(args[len(args)-1]) {
		commandUsage("completion")
		return nil
	}
	if len(args) != 1 {
		return usagef("usage: sidecar completion bash|zsh")
	}
	switch args[0] {
	case "bash":
		return writeBashCompletion(os.Stdout)
	case "zsh":
		return writeZshCompletion(os.Stdout)
	}
	return usagef("completion: unknown shell %q; want bash or zsh", args[0])
}

// visibleCommands are the command names a user types, sorted.
func visibleCommands() []string {
	var names []string
	for name, c := range commands {
		if !c.hidden {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// flagValues are the fixed values of flags, completed after the flag.
var flagValues = []struct {
	flag   string
	values []string
}{
	{"--network", []string{"none", "allowlist", "internet"}},
	{"-o", []string{"table", "text", "json"}},
}

// The scripts are generated from the command table, so a new command completes without
// touching this file. Beyond the subcommand, both complete the values of flagValues and
// fall back to file names.
func writeBashCompletion(w io.Writer) error {
	var cases strings.Builder
	for _, name := range visibleCommands() {
		if subs := commands[name].subs; len(subs) > 0 {
			fmt.Fprintf(&cases, "    %s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", name, strings.Join(subs, " "))
		}
	}
	var values strings.Builder
	for _, f := range flagValues {
		fmt.Fprintf(&values, "    %s) COMPREPLY=($(compgen -W %q -- \"$cur\")); return ;;\n", f.flag, strings.Join(f.values, " "))
	}
	_, err := fmt.Fprintf(w, `# bash completion for sidecar
_sidecar() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W %q -- "$cur"))
    return
  fi
  if [ "$COMP_CWORD" -eq 2 ]; then
    case ${COMP_WORDS[1]} in
%s    esac
  fi
  case ${COMP_WORDS[COMP_CWORD-1]} in
%s  esac
  COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o filenames -F _sidecar sidecar
`, strings.Join(visibleCommands(), " "), cases.String(), values.String())
	return err
}

func writeZshCompletion(w io.Writer) error {
	var cmds, cases, values strings.Builder
	for _, f := range flagValues {
		fmt.Fprintf(&values, "    %s) _values 'value' %s; return ;;\n", f.flag, strings.Join(f.values, " "))
	}
	for _, name := range visibleCommands() {
		fmt.Fprintf(&cmds, "    %q\n", name+":"+strings.ReplaceAll(commands[name].summary, ":", `\:`))
		if subs := commands[name].subs; len(subs) > 0 {
			fmt.Fprintf(&cases, "        %s) _values 'subcommand' %s ;;\n", name, strings.Join(subs, " "))
		}
	}
	_, err := fmt.Fprintf(w, `#compdef sidecar
# zsh completion for sidecar
_sidecar() {
  local -a cmds
  cmds=(
%s  )
  if (( CURRENT == 2 )); then
    _describe 'command' cmds
    return
  fi
  if (( CURRENT == 3 )); then
    case $words[2] in
%s        *) _files ;;
    esac
    return
  fi
  case $words[CURRENT-1] in
%s  esac
  _files
}
compdef _sidecar sidecar
`, cmds.String(), cases.String(), values.String())
	return err
}
