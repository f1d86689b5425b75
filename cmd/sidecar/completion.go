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

// Lease ids are completed live (sidecar leases ls -q, against the daemon the environment
// or the current context names) where a command takes a lease: as the first operand of
// leaseCommands, the operand after the subcommand of leaseSubcommands, and as the LEASE:
// of leasePathCommands' LEASE:PATH operands.
var (
	leaseCommands        = []string{"attach", "exec", "logs", "port-forward", "ps", "renew", "shell"}
	leaseSubcommands     = []string{"leases show", "leases rm", "leases network", "leases leftovers", "leases kill", "shells new", "shells ls", "shells run", "shells rm"}
	leasePathCommands    = []string{"cp", "edit", "find", "grep", "stat", "watch"}
	valueFlags           = []string{"--allow-out", "--ca-file", "--context", "--cwd", "--deny-out", "--env", "--exclude", "--if-match", "--input", "--label", "--lease-token", "--limit", "--max-file-bytes", "--maxdepth", "--name", "--network", "--new", "--old", "--session", "--shell", "--signal", "--timeout", "--token-file", "--ttl", "--type", "--url", "--wait", "-C", "-m", "-o"}
	leaseOperandPatterns = func() string {
		var p []string
		for _, c := range leaseCommands {
			p = append(p, c+":1")
		}
		for _, cs := range leaseSubcommands {
			c, sub, _ := strings.Cut(cs, " ")
			p = append(p, c+":"+sub+":2")
		}
		return strings.Join(p, "|")
	}
)

// The scripts are generated from the command table, so a new command completes without
// touching this file. Beyond the subcommand, both complete the values of flagValues, lease
// ids, and fall back to file names.
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
# _sidecar_operand: which operand (1 = the first after the command) the word being
# completed is, skipping flags and their values.
_sidecar_operand() {
  local i n=0 w
  for ((i=2; i<COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    case $w in
      --) ;;
      -*=*) ;;
      -*) case " %s " in *" $w "*) ((i++)) ;; esac ;;
      *) ((n++)) ;;
    esac
  done
  echo $((n+1))
}
_sidecar_lease_ids() {
  "${COMP_WORDS[0]}" leases ls -q 2>/dev/null
}
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
  if [[ $cur != -* ]]; then
    local n key
    n=$(_sidecar_operand)
    key=${COMP_WORDS[1]}:$n
    [ "$n" -gt 1 ] && key=${COMP_WORDS[1]}:${COMP_WORDS[2]}:$n
    [[ ${COMP_WORDS[1]}:${COMP_WORDS[2]} == leases:rm && $n -gt 1 ]] && key=leases:rm:2
    case $key in
      %s)
        COMPREPLY=($(compgen -W "$(_sidecar_lease_ids)" -- "$cur")); return ;;
    esac
    case ${COMP_WORDS[1]} in
      %s)
        if [[ $cur != *:* ]]; then
          local id
          COMPREPLY=($(compgen -f -- "$cur"))
          for id in $(_sidecar_lease_ids); do
            [[ $id: == "$cur"* ]] && COMPREPLY+=("$id:")
          done
          compopt -o nospace 2>/dev/null
          return
        fi ;;
    esac
  fi
  COMPREPLY=($(compgen -f -- "$cur"))
}
complete -o filenames -F _sidecar sidecar
`, strings.Join(valueFlags, " "), strings.Join(visibleCommands(), " "), cases.String(), values.String(),
		leaseOperandPatterns(), strings.Join(leasePathCommands, "|"))
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
%s    esac
  fi
  case $words[CURRENT-1] in
%s  esac
  local -a valueflags ids
  valueflags=(%s)
  local i n=0 key
  for (( i = 3; i < CURRENT; i++ )); do
    case $words[i] in
      --|-*=*) ;;
      -*) (( ${valueflags[(Ie)$words[i]]} )) && (( i++ )) ;;
      *) (( n++ )) ;;
    esac
  done
  (( n++ ))
  key=$words[2]:$n
  (( n > 1 )) && key=$words[2]:$words[3]:$n
  [[ $words[2]:$words[3] == leases:rm ]] && (( n > 1 )) && key=leases:rm:2
  if [[ $words[CURRENT] != -* ]]; then
    case $key in
      %s)
        ids=(${(f)"$(${words[1]} leases ls -q 2>/dev/null)"})
        compadd -a ids; return ;;
    esac
    case $words[2] in
      %s)
        if [[ $words[CURRENT] != *:* ]]; then
          ids=(${(f)"$(${words[1]} leases ls -q 2>/dev/null)"})
          compadd -S '' -- ${^ids}:
          _files
          return
        fi ;;
    esac
  fi
  _files
}
compdef _sidecar sidecar
`, cmds.String(), cases.String(), values.String(), strings.Join(valueFlags, " "),
		leaseOperandPatterns(), strings.Join(leasePathCommands, "|"))
	return err
}
