#!/usr/bin/env python3
"""Writes the bash completion of one PeerMesh tool (scripts/package): its flags, as its --help lists them (argv[2]);
the values some flags take; and, for mesh-play --host, the hosts `mesh-play --list` finds at that moment."""
import sys

tool, flags = sys.argv[1], sys.argv[2].split()
fn = "_" + tool.replace("-", "_")
values = {
    "--accept": "paired ask all",
    "--latency": "auto low",
    "--sample-format": "s16 s24 f32",
    "--direction": "both to-target from-target",
}
subcommands = "ctl" if tool == "mesh-record" else ""
print(f"""# bash completion for {tool} (generated from `{tool} --help` by scripts/package)
{fn}() {{
    local cur prev
    cur=${{COMP_WORDS[COMP_CWORD]}}
    prev=${{COMP_WORDS[COMP_CWORD-1]}}""")
if tool == "mesh-record":
    print("""    if [[ ${COMP_WORDS[1]} == ctl ]]; then
        if ((COMP_CWORD == 2)); then COMPREPLY=($(compgen -W "status pair paired forget mute unmute" -- "$cur")); return; fi
        [[ $cur == -* ]] && COMPREPLY=($(compgen -W "--runtime-dir --help" -- "$cur"))
        return
    fi""")
print("    case $prev in")
for flag, v in values.items():
    if flag in flags:
        print(f"        {flag}) COMPREPLY=($(compgen -W \"{v}\" -- \"$cur\")); return ;;")
if tool == "mesh-play":
    print("""        --host)
            local hosts
            hosts=$(mesh-play --list --duration 1 2>/dev/null | cut -f1)
            COMPREPLY=($(compgen -W "$hosts" -- "$cur")); return ;;""")
print("""        --output|--input|--state-dir|--runtime-dir) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --device) COMPREPLY=($(compgen -W "default $(aplay -L 2>/dev/null | grep -v '^ ')" -- "$cur")); return ;;
    esac""")
print(f"""    COMPREPLY=($(compgen -W "{' '.join(flags)} {subcommands}" -- "$cur"))
}}
complete -F {fn} {tool}""")
