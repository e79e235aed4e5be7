#!/usr/bin/env bash
# Start a throw-away sshd on loopback for the terminal-app-over-SSH test
# (../shared/design/PEERS.md): host and client keys made here, root login by
# key only, no PAM. Prints "PORT KEYFILE" on stdout; the caller kills
# the pid written to $DIR/sshd.pid.
set -euo pipefail
DIR=${1:?usage: sshd.sh DIR}
PORT=${2:-18022}
mkdir -p "$DIR" /run/sshd
chmod 700 "$DIR"
[ -f "$DIR/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/host_key"
[ -f "$DIR/client_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/client_key"
cp "$DIR/client_key.pub" "$DIR/authorized_keys"
chmod 600 "$DIR/authorized_keys"
cat > "$DIR/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $PORT
HostKey $DIR/host_key
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $DIR/sshd.pid
AcceptEnv LANG LC_* ADF_HOME
CONF
/usr/sbin/sshd -f "$DIR/sshd_config" -E "$DIR/sshd.log"
for _ in $(seq 1 50); do
  [ -s "$DIR/sshd.pid" ] && break
  sleep 0.1
done
echo "$PORT $DIR/client_key"
