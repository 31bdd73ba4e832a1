# bash completion for apir, apir-host, apir-gguf-gen and apir-whisper-gen.
# Installed as share/bash-completion/completions/apir (and links named after
# the other programs); bash-completion loads it on first use.
#
# The option lists come from each program's own --help (run at each
# completion), so they never drift from the programs' option tables.

_apir_help_options() { # program [subcommand]: the long and short options its --help names
    local prog=$1 sub=${2:-}
    if [ -n "$sub" ]; then "$prog" "$sub" --help 2>/dev/null; else "$prog" --help 2>/dev/null; fi |
        grep -oE '(^|[ ,])--?[a-zA-Z][a-zA-Z0-9-]*' | sed 's/^[ ,]*//' | sort -u
}

_apir_endpoints() {
    local cur=$1
    case $cur in
        unix:*) local p=${cur#unix:}; compgen -f -P unix: -- "$p" ;;
        *) compgen -W "unix: tcp: tls: vsock: virtgpu" -- "$cur" ;;
    esac
}

_apir() {
    local cur prev words cword
    _init_completion -n : 2>/dev/null || { cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }
    local prog=${words[0]} sub="" i
    for ((i = 1; i < cword; i++)); do
        case ${words[i]} in -*) ;; *) sub=${words[i]}; break ;; esac
    done
    if [ -z "$sub" ]; then
        COMPREPLY=($(compgen -W "ping info run stat ps cdi help --help --version" -- "$cur"))
        return
    fi
    case $sub in
        help) COMPREPLY=($(compgen -W "ping info run stat ps cdi" -- "$cur")); return ;;
        run)
            # after --, complete the command to run
            for ((i = 2; i < cword; i++)); do
                if [ "${words[i]}" = -- ]; then COMPREPLY=($(compgen -c -- "$cur")); return; fi
            done ;;
    esac
    case $prev in
        -H|--host) COMPREPLY=($(_apir_endpoints "$cur")); return ;;
        --library|--control|-C) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    esac
    COMPREPLY=($(compgen -W "$(_apir_help_options "$prog" "$sub")" -- "$cur"))
}

_apir_host() {
    local cur prev
    cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    case $prev in
        -H|--listen) COMPREPLY=($(_apir_endpoints "$cur")); return ;;
        --backend-dir|--weight-cache|--worker-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
        --token-file|--tls-psk-file|--tls-cert|--tls-key|--tls-ca|--log-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --log-level) COMPREPLY=($(compgen -W "error warn info debug" -- "$cur")); return ;;
        --isolation) COMPREPLY=($(compgen -W "process thread" -- "$cur")); return ;;
    esac
    COMPREPLY=($(compgen -W "$(_apir_help_options "${COMP_WORDS[0]}")" -- "$cur"))
}

_apir_gen() {
    local cur prev
    cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    case $prev in
        -o|--output) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    esac
    COMPREPLY=($(compgen -W "$(_apir_help_options "${COMP_WORDS[0]}")" -- "$cur"))
}

complete -F _apir apir
complete -F _apir_host apir-host
complete -F _apir_gen apir-gguf-gen apir-whisper-gen
