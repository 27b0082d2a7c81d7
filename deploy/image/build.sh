#!/usr/bin/env bash
# Builds drey's container image from Debian packages alone, for machines that
# reach Debian's archive but no image registry (deploy/Dockerfile's
# `FROM debian:12-slim` cannot be pulled there). Describes the same image as
# deploy/Dockerfile; tests/deploy/image_test.sh checks that it does.
#
#   deploy/image/build.sh [--import NAME] OUT_DIR DREYD DREY
#
# OUT_DIR/rootfs.tar  a minimal root file system: the Debian packages that
#                     hold the shared libraries DREYD and DREY link (found
#                     with ldd, mapped with dpkg -S) and their dependencies,
#                     unpacked by mmdebstrap --variant=extract (no maintainer
#                     scripts, no shell, no apt), plus /etc/passwd with the
#                     unprivileged user 10001, its data directory, and the
#                     two binaries in /usr/local/bin
# OUT_DIR/config      the image configuration, one Dockerfile-style
#                     instruction per line (what --import applies)
# OUT_DIR/packages    the packages asked for
# --import NAME       also `podman import` it as NAME; set PODMAN to the
#                     podman command line to use (e.g. with --root/--runroot)
#
# The archive comes from the host's own apt sources (whatever mirror the
# machine uses), and the sources are not left in the image. Needs root (or
# mmdebstrap's unshare mode) and mmdebstrap; podman only for --import.
set -euo pipefail

say() { printf 'build.sh: %s\n' "$*" >&2; }

import=""
if [[ "${1:-}" == "--import" ]]; then
    import="$2"
    shift 2
fi
if [[ $# -ne 3 ]]; then
    sed -n '7,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
out="$1"
dreyd="$(readlink -f "$2")"
drey="$(readlink -f "$3")"
for b in "$dreyd" "$drey"; do
    [[ -x "$b" ]] || { say "not an executable: $b"; exit 1; }
done
command -v mmdebstrap >/dev/null || { say "mmdebstrap is not installed"; exit 1; }
mkdir -p "$out"

# The image's configuration. Keep it the same as deploy/Dockerfile's USER,
# WORKDIR, EXPOSE, ENV and ENTRYPOINT, and PATH as debian:12-slim sets it
# (tests/deploy/test_image.py compares).
cat > "$out/config" <<'CONFIG'
USER 10001
WORKDIR /var/lib/drey
EXPOSE 50051
EXPOSE 9090
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV DREY_LISTEN=0.0.0.0:50051
ENV DREY_OPS_LISTEN=0.0.0.0:9090
ENV DREY_DATA_DIR=/var/lib/drey/data
ENTRYPOINT ["/usr/local/bin/dreyd"]
CONFIG

# Shared libraries -> the Debian packages that own them, in one dpkg-query
# call. With merged /usr a library resolves to /lib/... or /usr/lib/...
# while dpkg may know it by the other name: ask for both.
libs=$(for b in "$dreyd" "$drey"; do ldd "$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' | sort -u)
names=()
for lib in $libs; do
    names+=("$lib" "/usr${lib#/usr}" "${lib#/usr}")
done
owners=$(dpkg-query -S "${names[@]}" 2>/dev/null || true)
pkgs=()
for lib in $libs; do
    p=$(awk -v a="$lib" -v b="/usr${lib#/usr}" -v c="${lib#/usr}" \
        '{ path = $0; sub(/^[^:]*(:[a-z0-9]+)?: /, "", path) } path == a || path == b || path == c {
            sub(/[:,].*/, ""); print; exit }' <<< "$owners")
    [[ -n "$p" ]] || { say "no Debian package owns $lib (needed by dreyd or drey)"; exit 1; }
    pkgs+=("$p")
done
# ca-certificates: as in the Dockerfile, for outgoing TLS of any kind.
pkgs+=(ca-certificates)
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
printf '%s\n' "${pkgs[@]}" > "$out/packages"

# Sources: the host's apt sources file(s), given to mmdebstrap by path.
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
    [[ -s "$f" ]] && sources+=("$f")
done
[[ ${#sources[@]} -gt 0 ]] || { say "no apt sources on this machine"; exit 1; }

# mmdebstrap's extract variant runs no --customize-hook (silently): the
# image's own files are written in an --extract-hook. It runs no maintainer
# scripts either, so the CA bundle update-ca-certificates would make is
# made here.
hook=$(cat <<'HOOK'
set -eu
root="$1"
mkdir -p "$root/usr/local/bin" "$root/var/lib/drey/data" "$root/tmp" "$root/etc/ssl/certs"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\ndrey:x:10001:10001:drey:/var/lib/drey:/usr/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\ndrey:x:10001:\n' > "$root/etc/group"
chown -R 10001:10001 "$root/var/lib/drey"
chmod 0750 "$root/var/lib/drey" "$root/var/lib/drey/data"
find "$root/usr/share/ca-certificates" -name '*.crt' -type f | sort | xargs cat > "$root/etc/ssl/certs/ca-certificates.crt"
install -m 0755 "$DREY_IMAGE_DREYD" "$root/usr/local/bin/dreyd"
install -m 0755 "$DREY_IMAGE_DREY" "$root/usr/local/bin/drey"
rm -rf "$root/etc/apt/sources.list" "$root/etc/apt/sources.list.d"
HOOK
)
start=$(date +%s%N)
inc=$(IFS=,; echo "${pkgs[*]}")
DREY_IMAGE_DREYD="$dreyd" DREY_IMAGE_DREY="$drey" \
    mmdebstrap --quiet --variant=extract --include="$inc" --extract-hook="$hook" \
    bookworm "$out/rootfs.tar" "${sources[@]}"
end=$(date +%s%N)
ms=$(((end - start) / 1000000))
say "rootfs.tar: $(($(stat -c %s "$out/rootfs.tar") / 1000000)) MB, ${#pkgs[@]} packages, mmdebstrap took ${ms} ms"

if [[ -n "$import" ]]; then
    # One --change per ENV variable and per port: `podman import` takes
    # `ENV A=1 B=2` as one variable and refuses `EXPOSE 50051 9090`.
    changes=()
    while IFS= read -r line; do
        changes+=(--change "$line")
    done < "$out/config"
    ${PODMAN:-podman} import "${changes[@]}" "$out/rootfs.tar" "$import" >/dev/null
    say "imported as $import"
fi
