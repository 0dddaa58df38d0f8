#!/usr/bin/env bash
# Installs edged from this source tree as a systemd service: the edged system user, a venv in
# /opt/edged/venv, /etc/edged/edged.yaml (only when absent), the units, the demo model and
# video, then enables edged.socket and edged.service. Run it again at any time: it changes
# only what differs and says so. `deploy/install.sh --help` lists the options.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: deploy/install.sh [OPTIONS]

  --flavor auto|jetson|dgpu|cpu   hardware to install for (default auto: Jetson when
                                  /etc/nv_tegra_release or the device tree says nvidia,tegra;
                                  dgpu when /dev/nvidia0 or nvidia-smi exists; cpu otherwise)
  --detect                        print the flavor auto would pick, and why, then exit
  --root DIR                      install under DIR (DIR/etc/edged, DIR/opt/edged/venv, ...)
                                  without touching the running system; implies --no-systemctl.
                                  The venv in DIR runs in place only (venvs do not move).
  --no-systemctl                  install the units but do not reload, enable or start them
  --no-demo                       skip the demo model and video the default config streams
  --python PYTHON                 interpreter for the venv (default python3; 3.10 or newer)
  --pip-args "ARGS"               extra pip arguments, e.g. "--extra-index-url URL" (Jetson:
                                  NVIDIA's index for onnxruntime-gpu) or "--no-index
                                  --find-links DIR" offline
  --mqtt-password-file FILE       copy FILE to /etc/edged/credentials/mqtt-password and pass it
                                  to the service as the credential mqtt-password (the config
                                  names it: mqtt.password_file: mqtt-password)
  --ota-key FILE                  copy an OTA public key to /etc/edged/credentials/ and pass it
                                  as a credential named after the file (list that name in
                                  ota.trusted_keys); repeatable
  --mender auto|yes|no            install the Mender update module edged-model and its state
                                  script (default auto: when the mender client is installed)
  --uninstall                     stop and remove the units, venv and sysusers file; keep
                                  /etc/edged, /var/lib/edged and /var/cache/edged
  --purge                         with --uninstall: remove those three as well
  -h, --help                      this text

Environment for tests of --flavor auto: EDGED_TEGRA_RELEASE, EDGED_DT_COMPATIBLE,
EDGED_NVIDIA_DEVICE, EDGED_NVIDIA_SMI replace the probed paths and command.
EOF
}

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPLOY=$SRC/deploy

root="" flavor=auto use_systemctl=1 demo=1 python=python3 pip_args=""
mqtt_password_file="" ota_keys=() uninstall=0 purge=0 detect_only=0 mender=auto

die() { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }
say() { printf 'install.sh: %s\n' "$*"; }
warn() { printf 'install.sh: warning: %s\n' "$*" >&2; }

need_arg() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --root) need_arg "$@"; root=$2; shift ;;
        --flavor) need_arg "$@"; flavor=$2; shift ;;
        --detect) detect_only=1 ;;
        --no-systemctl) use_systemctl=0 ;;
        --no-demo) demo=0 ;;
        --python) need_arg "$@"; python=$2; shift ;;
        --pip-args) [[ $# -ge 2 ]] || die "--pip-args needs a value"; pip_args=$2; shift ;;
        --mqtt-password-file) need_arg "$@"; mqtt_password_file=$2; shift ;;
        --ota-key) need_arg "$@"; ota_keys+=("$2"); shift ;;
        --mender) need_arg "$@"; mender=$2; shift ;;
        --uninstall) uninstall=1 ;;
        --purge) purge=1 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
    shift
done

case $flavor in auto | jetson | dgpu | cpu) ;; *) die "--flavor: auto, jetson, dgpu or cpu, not '$flavor'" ;; esac
case $mender in auto | yes | no) ;; *) die "--mender: auto, yes or no, not '$mender'" ;; esac
((purge == 0 || uninstall == 1)) || die "--purge goes with --uninstall"

if [[ -n $root ]]; then
    mkdir -p "$root"
    root=$(cd "$root" && pwd)
    use_systemctl=0
elif ((detect_only == 0)) && [[ $(id -u) -ne 0 ]]; then
    die "run as root (sudo $0), or give --root DIR to install under a directory"
fi

# Paths on the target system; $root prefixes them on disk, never inside the files written.
ETC=/etc/edged
CREDENTIALS=$ETC/credentials
UNITS=/etc/systemd/system
DROPINS=$UNITS/edged.service.d
SYSUSERS=/usr/lib/sysusers.d/edged.conf
OPT=/opt/edged
VENV=$OPT/venv
STATE=/var/lib/edged
CACHE=/var/cache/edged
MENDER_MODULE=/usr/share/mender/modules/v3/edged-model
MENDER_GUARD=/etc/mender/scripts/Download_Enter_50_edged-model

changed=0     # things this run created or altered
restart=0     # the service's code or units changed: a running edged must restart

# -- flavor ----------------------------------------------------------------------------------
detect_flavor() {
    local tegra=${EDGED_TEGRA_RELEASE:-/etc/nv_tegra_release}
    local compatible=${EDGED_DT_COMPATIBLE:-/proc/device-tree/compatible}
    local nvidia=${EDGED_NVIDIA_DEVICE:-/dev/nvidia0}
    local smi=${EDGED_NVIDIA_SMI:-nvidia-smi}
    if [[ -e $tegra ]]; then
        echo "jetson ($tegra exists: L4T)"
    elif [[ -r $compatible ]] && tr '\0' '\n' <"$compatible" | grep -q '^nvidia,tegra'; then
        echo "jetson ($compatible lists nvidia,tegra)"
    elif [[ -e $nvidia ]]; then
        echo "dgpu ($nvidia exists)"
    elif command -v "$smi" >/dev/null 2>&1; then
        echo "dgpu ($smi is installed)"
    else
        echo "cpu (no $tegra, no nvidia,tegra in $compatible, no $nvidia, no $smi)"
    fi
}

if [[ $flavor == auto ]] && ((uninstall == 0)); then
    detected=$(detect_flavor)
    flavor=${detected%% *}
    say "flavor: $detected"
    ((detect_only == 0)) || exit 0
elif ((detect_only)); then
    say "flavor: $flavor (given)"
    exit 0
fi

# -- helpers that change only what differs ---------------------------------------------------
owner_ids=""  # uid:gid of the edged user on the target, when known and settable
resolve_owner() {
    [[ $(id -u) -eq 0 ]] || return 0
    if [[ -z $root ]]; then
        id -u edged >/dev/null 2>&1 && owner_ids="$(id -u edged):$(id -g edged)"
    elif [[ -f $root/etc/passwd ]]; then
        owner_ids=$(awk -F: '$1 == "edged" { print $3 ":" $4 }' "$root/etc/passwd")
    fi
    return 0
}

file_mode() { stat -c '%a' "$1"; }

ensure_dir() {  # ensure_dir PATH MODE [edged]
    local dir=$root$1 mode=$2
    if [[ ! -d $dir ]]; then
        mkdir -p "$dir"
        say "created $1"
        changed=$((changed + 1))
    fi
    if [[ $(file_mode "$dir") != "${mode#0}" ]]; then
        chmod "$mode" "$dir"
        changed=$((changed + 1))
    fi
    if [[ ${3:-} == edged ]]; then
        chown_tree "$1"
    fi
}

chown_tree() {  # give the edged user what this script put under PATH
    local path=$root$1
    [[ -n $owner_ids && -e $path ]] || return 0
    local uid=${owner_ids%:*} gid=${owner_ids#*:}
    if [[ -n $(find "$path" \( ! -uid "$uid" -o ! -gid "$gid" \) -print -quit) ]]; then
        chown -R "$owner_ids" "$path"
        changed=$((changed + 1))
    fi
}

install_file() {  # install_file SOURCE TARGET MODE: copy when the content or mode differs
    local source=$1 target=$root$2 mode=$3
    if [[ -f $target ]] && cmp -s "$source" "$target"; then
        if [[ $(file_mode "$target") != "${mode#0}" ]]; then
            chmod "$mode" "$target"
            changed=$((changed + 1))
        fi
        return 1
    fi
    mkdir -p "$(dirname "$target")"
    install -m "$mode" "$source" "$target.tmp.$$"
    mv -f "$target.tmp.$$" "$target"
    say "installed $2"
    changed=$((changed + 1))
    return 0
}

remove_path() {
    local path=$root$1
    if [[ -e $path || -L $path ]]; then
        rm -rf "$path"
        say "removed $1"
        changed=$((changed + 1))
        return 0
    fi
    return 1
}

systemd_running() { [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; }

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT

# -- uninstall -------------------------------------------------------------------------------
if ((uninstall)); then
    if ((use_systemctl)) && systemd_running; then
        systemctl disable --now edged.socket edged.service || true
    fi
    for path in "$UNITS/edged.service" "$UNITS/edged.socket" "$DROPINS/dgpu.conf" \
        "$DROPINS/jetson.conf" "$DROPINS/credentials.conf" "$VENV" "$SYSUSERS" \
        "$MENDER_MODULE" "$MENDER_GUARD"; do
        remove_path "$path" || true
    done
    # An operator's own drop-ins (systemctl edit edged) stay, and with them the folder.
    rmdir "$root$DROPINS" 2>/dev/null || true
    rmdir "$root$OPT" 2>/dev/null || true
    if ((purge)); then
        for path in "$ETC" "$STATE" "$CACHE"; do remove_path "$path" || true; done
    else
        say "kept $ETC, $STATE and $CACHE (--purge removes them)"
    fi
    if ((use_systemctl)) && systemd_running; then
        systemctl daemon-reload
    fi
    say "kept the edged user: files it owns may outlive this (userdel edged removes it)"
    ((changed)) || say "nothing to remove"
    exit 0
fi

# -- the edged user --------------------------------------------------------------------------
install_file "$DEPLOY/edged.sysusers.conf" "$SYSUSERS" 0644 || true
accounts() {  # what the user databases hold now (empty files when absent)
    local file
    for file in "$root/etc/passwd" "$root/etc/group"; do
        [[ ! -f $file ]] || cat "$file"
    done | cksum
}
accounts_before=$(accounts)
if [[ -n $root && $(id -u) -ne 0 ]]; then
    # sysusers cannot reread the shadow files it wrote (mode 0000) without root.
    say "not root: the edged user is left to systemd-sysusers on the target (boot runs it)"
elif command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir -p "$root/etc"  # under --root: where sysusers writes passwd, group, shadow
    systemd-sysusers ${root:+--root="$root"} edged.conf
elif [[ -z $root ]]; then
    # No systemd-sysusers (a container image, say): the same accounts by hand.
    for group in edged video render; do
        getent group "$group" >/dev/null || groupadd --system "$group"
    done
    if ! id edged >/dev/null 2>&1; then
        useradd --system --gid edged --home-dir "$STATE" --no-create-home \
            --shell "$(command -v nologin || echo /usr/sbin/nologin)" \
            --comment "edged inference daemon" edged
    fi
    for group in video render; do
        id -nG edged | tr ' ' '\n' | grep -qx "$group" || usermod -aG "$group" edged
    done
else
    warn "no systemd-sysusers: the edged user is not created under $root" \
        "(the target creates it from $SYSUSERS at boot)"
fi
if [[ $(accounts) != "$accounts_before" ]]; then
    say "created the edged user or its group memberships"
    changed=$((changed + 1))
fi
resolve_owner
[[ -n $owner_ids || $(id -u) -ne 0 ]] ||
    warn "the edged user is unknown here: files stay root's until systemd hands them over"

# -- directories -----------------------------------------------------------------------------
ensure_dir "$ETC" 0755
ensure_dir "$CREDENTIALS" 0700
ensure_dir "$STATE" 0750 edged
ensure_dir "$STATE/models" 0750 edged
ensure_dir "$CACHE" 0750 edged
ensure_dir "$OPT" 0755

# -- the venv and edged in it ----------------------------------------------------------------
case $flavor in
    cpu) extras=cpu,video,systemd ;;
    dgpu) extras=gpu,video,systemd ;;
    # TensorRT and OpenCV with GStreamer come from JetPack, onnxruntime-gpu from NVIDIA's
    # Jetson index (--pip-args "--extra-index-url https://pypi.jetson-ai-lab.io/jp6/cu126",
    # or a wheel NVIDIA publishes for your JetPack): the venv sees the system's packages.
    jetson) extras=jetson,systemd ;;
esac
system_site=false
[[ $flavor != jetson ]] || system_site=true

if [[ ! -x $root$VENV/bin/python ]]; then
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
        die "$python is older than Python 3.10 (give another with --python)"
    venv_args=()
    [[ $system_site == false ]] || venv_args+=(--system-site-packages)
    "$python" -m venv "${venv_args[@]}" "$root$VENV"
    say "created the venv $VENV"
    changed=$((changed + 1))
elif ! grep -qx "include-system-site-packages = $system_site" "$root$VENV/pyvenv.cfg"; then
    sed -i "s/^include-system-site-packages = .*/include-system-site-packages = $system_site/" \
        "$root$VENV/pyvenv.cfg"
    say "venv: include-system-site-packages = $system_site (flavor $flavor)"
    changed=$((changed + 1))
fi

# What is installed is keyed by the source, the extras and the pip arguments: an unchanged
# tree is not reinstalled (delete $VENV/.edged-installed to force it).
stage=$workdir/src
mkdir -p "$stage"
cp -r "$SRC/pyproject.toml" "$SRC/README.md" "$SRC/edged" "$stage/"
find "$stage" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
installed_key=$(
    cd "$stage"
    find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    printf 'extras=%s\npip-args=%s\n' "$extras" "$pip_args"
)
installed_key=$(printf '%s' "$installed_key" | sha256sum | cut -d' ' -f1)
stamp=$root$VENV/.edged-installed
if [[ -f $stamp && $(cat "$stamp") == "$installed_key" ]]; then
    say "venv: edged is up to date"
else
    read -r -a extra_pip_args <<<"$pip_args"
    pip=("$root$VENV/bin/python" -m pip install --disable-pip-version-check "${extra_pip_args[@]}")
    also=()
    hint=""
    if [[ $flavor == jetson ]]; then
        # JetPack's cv2 is built against Ubuntu 22.04's NumPy 1.x and fails to import next
        # to a NumPy 2 in the venv.
        echo "numpy<2" >"$workdir/constraints.txt"
        pip+=(--constraint "$workdir/constraints.txt")
        # The jetson extra leaves ONNX Runtime out: PyPI has no CUDA build for aarch64. Unless
        # the system has one, or the operator manages dependencies (--no-deps), ask for it.
        if [[ " $pip_args " != *" --no-deps "* ]] &&
            ! "$root$VENV/bin/python" -c 'import onnxruntime' 2>/dev/null; then
            also+=(onnxruntime-gpu)
            hint=" (onnxruntime-gpu for JetPack comes from NVIDIA's Jetson index:"
            hint+=" --pip-args \"--extra-index-url https://pypi.jetson-ai-lab.io/jp6/cu126\")"
        fi
    fi
    if ! "${pip[@]}" "${stage}[$extras]" "${also[@]}"; then
        [[ $extras == *systemd* ]] || die "pip could not install edged[$extras]$hint"
        # systemd-python compiles against libsystemd (libsystemd-dev, pkg-config). edged
        # speaks the notify and socket protocols itself, so it runs without it.
        warn "installing with the systemd extra failed; retrying without systemd-python" \
            "(apt-get install libsystemd-dev pkg-config, then rerun, to have it)"
        extras=${extras/,systemd/}
        "${pip[@]}" "${stage}[$extras]" "${also[@]}" ||
            die "pip could not install edged[$extras]$hint"
    fi
    printf '%s\n' "$installed_key" >"$stamp"
    say "venv: installed edged[$extras]${also[*]:+ and ${also[*]}}"
    "$root$VENV/bin/python" -c 'import onnxruntime' 2>/dev/null ||
        warn "onnxruntime is not importable in the venv: edged cannot load a model until it is"
    changed=$((changed + 1))
    restart=1
fi

# jemalloc serves the daemon's C heap where it is installed (`allocator: auto`, the default);
# on glibc's heap RSS grows a little at each OTA swap (docs/decisions/031).
if ! compgen -G "$root/usr/lib/*/libjemalloc.so.2" >/dev/null &&
    ! compgen -G "$root/usr/lib*/libjemalloc.so.2" >/dev/null; then
    warn "libjemalloc2 is not installed: edged will run on glibc's heap, which grows a" \
        "little at each model update (apt-get install libjemalloc2)"
fi

# -- config ----------------------------------------------------------------------------------
# The operator's edged.yaml is never overwritten; edged.yaml.dist is this release's default.
install_file "$DEPLOY/edged.yaml" "$ETC/edged.yaml.dist" 0644 || true
if [[ ! -e $root$ETC/edged.yaml ]]; then
    install_file "$DEPLOY/edged.yaml" "$ETC/edged.yaml" 0644 || true
elif ! cmp -s "$root$ETC/edged.yaml" "$DEPLOY/edged.yaml"; then
    say "kept $ETC/edged.yaml (it differs from $ETC/edged.yaml.dist)"
fi

# -- credentials -----------------------------------------------------------------------------
credential_name_ok() { [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; }
if [[ -n $mqtt_password_file ]]; then
    [[ -r $mqtt_password_file ]] || die "--mqtt-password-file: cannot read $mqtt_password_file"
    install_file "$mqtt_password_file" "$CREDENTIALS/mqtt-password" 0600 && restart=1
fi
for key in "${ota_keys[@]}"; do
    [[ -r $key ]] || die "--ota-key: cannot read $key"
    name=$(basename "$key")
    credential_name_ok "$name" || die "--ota-key: '$name' is not a usable credential name"
    install_file "$key" "$CREDENTIALS/$name" 0600 && restart=1
done
# One LoadCredential= per file in the credentials folder, so a rerun without the options
# keeps what an earlier run (or the operator) put there.
credentials_conf=$workdir/credentials.conf
{
    echo "# Written by deploy/install.sh from the files in $CREDENTIALS; rerun it after"
    echo "# adding or removing one. The service reads each as \$CREDENTIALS_DIRECTORY/<name>."
    echo "[Service]"
} >"$credentials_conf"
credential_count=0
for path in "$root$CREDENTIALS"/*; do
    [[ -f $path ]] || continue
    name=$(basename "$path")
    if ! credential_name_ok "$name"; then
        warn "skipping $CREDENTIALS/$name: not a usable credential name"
        continue
    fi
    echo "LoadCredential=$name:$CREDENTIALS/$name" >>"$credentials_conf"
    credential_count=$((credential_count + 1))
done
if ((credential_count)); then
    install_file "$credentials_conf" "$DROPINS/credentials.conf" 0644 && restart=1
else
    remove_path "$DROPINS/credentials.conf" && restart=1
fi

# -- units -----------------------------------------------------------------------------------
install_file "$DEPLOY/edged.service" "$UNITS/edged.service" 0644 && restart=1
install_file "$DEPLOY/edged.socket" "$UNITS/edged.socket" 0644 || true
for other in dgpu jetson; do
    if [[ $other == "$flavor" ]]; then
        install_file "$DEPLOY/edged.service.d/$other.conf" "$DROPINS/$other.conf" 0644 &&
            restart=1
    else
        remove_path "$DROPINS/$other.conf" && restart=1
    fi
done

# -- Mender ----------------------------------------------------------------------------------
# The update module hands edged-model artifacts to edged's own installer; the state script
# refuses a new Mender install while one of them waits for `mender commit` or `rollback`.
if [[ $mender == yes || ($mender == auto && -x $root/usr/bin/mender) ]]; then
    install_file "$DEPLOY/mender/edged-model" "$MENDER_MODULE" 0755 || true
    install_file "$DEPLOY/mender/Download_Enter_50_edged-model" "$MENDER_GUARD" 0755 || true
    scripts_version=$root$(dirname "$MENDER_GUARD")/version
    if [[ ! -e $scripts_version ]]; then  # mender runs state scripts of format 3 only
        echo 3 >"$scripts_version"
        say "created $(dirname "$MENDER_GUARD")/version"
        changed=$((changed + 1))
    fi
fi

# -- demo ------------------------------------------------------------------------------------
# The default config streams file:///var/lib/edged/demo/colors.avi through the model colors
# and demo/crossing.avi through the detector grid_det. Installed once: an OTA update of a demo
# model, or the operator's own video, is never replaced.
if ((demo)); then
    if [[ -e $root$STATE/models/colors && -e $root$STATE/demo/colors.avi &&
          -e $root$STATE/models/grid_det && -e $root$STATE/demo/crossing.avi ]]; then
        say "demo: models and videos present"
    elif (cd "$SRC" && PYTHONDONTWRITEBYTECODE=1 "$root$VENV/bin/python" -m tools.assets.demo \
        "$workdir/demo" >/dev/null); then
        for model in colors grid_det; do
            if [[ ! -e $root$STATE/models/$model ]]; then
                cp -r "$workdir/demo/models/$model" "$root$STATE/models/$model"
                say "demo: installed the model $STATE/models/$model"
            fi
        done
        for video in colors.avi crossing.avi; do
            if [[ ! -e $root$STATE/demo/$video ]]; then
                ensure_dir "$STATE/demo" 0750
                install_file "$workdir/demo/$video" "$STATE/demo/$video" 0640 || true
            fi
        done
        chown_tree "$STATE"
        changed=$((changed + 1))
    else
        warn "demo assets could not be made: the default config's streams 'demo' and" \
            "'crossing' and models 'colors' and 'grid_det' will be missing; edit $ETC/edged.yaml"
    fi
fi

# -- systemd ---------------------------------------------------------------------------------
enabled=0
if ((use_systemctl)); then
    if systemd_running; then
        systemctl daemon-reload
        systemctl enable --now edged.socket edged.service
        enabled=1
        if ((restart)) && systemctl is-active --quiet edged.service; then
            say "restarting edged: its code, units or credentials changed"
            systemctl restart edged.service
        fi
    else
        warn "systemd is not running here (no /run/systemd/system): units installed, not enabled"
    fi
fi

# -- summary ---------------------------------------------------------------------------------
if ((changed == 0)); then
    say "nothing changed: edged ($flavor) is installed as before"
fi
dropins=""
for path in "$root$DROPINS"/*.conf; do
    [[ ! -f $path ]] || dropins+=" $(basename "$path")"
done
cat <<EOF

edged ($flavor) installed${root:+ under $root}:
  venv     $VENV
  config   $ETC/edged.yaml (validate: $VENV/bin/edged check-config $ETC/edged.yaml)
  models   $STATE/models, engines in $CACHE
  units    $UNITS/edged.service, edged.socket${dropins:+; edged.service.d:$dropins}
EOF
if ((enabled)); then
    cat <<EOF
  status   systemctl status edged; sudo $VENV/bin/edged status
  logs     journalctl -u edged -f
  reload   systemctl reload edged (re-reads $ETC/edged.yaml)
EOF
elif [[ -z $root ]]; then
    echo "  start    systemctl enable --now edged.socket edged.service"
fi
