#!/usr/bin/env bash
# Real mail servers on loopback for tests/email.rs (issue 20, PEERS.md):
# Dovecot (IMAP with IDLE, the Debian package) and an SMTP server on
# aiosmtpd (PyPI, in a venv cached outside the clone) that authenticates
# against the same users and delivers through dovecot-lda. TLS everywhere,
# from a throw-away CA made here: IMAP STARTTLS 10143 and TLS 10993, SMTP
# STARTTLS 10587 and TLS 10465. Users ann, bob, cy and dee @adf.test, the
# password of each is "pw-<name>". Prints the CA file on stdout; the
# caller kills the pids in $DIR/dovecot.pid and $DIR/smtp.pid.
# `mail.sh --install` only installs (CI does it ahead, in the background).
set -euo pipefail
DIR=${1:?usage: mail.sh DIR}
V=1.4.6
VENV=/var/cache/adf-peers/aiosmtpd-$V
if [ ! -x /usr/sbin/dovecot ] || [ ! -x /usr/lib/dovecot/dovecot-lda ] || ! command -v openssl >/dev/null 2>&1; then
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends dovecot-imapd openssl >&2
fi
if [ ! -f "$VENV/.ok" ]; then
  if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    apt-get update -qq >&2 && apt-get install -y -qq python3-venv >&2
  fi
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q "aiosmtpd==$V" >&2
  touch "$VENV/.ok"
fi
[ "$DIR" = --install ] && exit 0
# Dovecot will not give mail to uid 0: the mailboxes belong to a user of
# their own.
id adfmail >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin adfmail >&2
MUID=$(id -u adfmail)
MGID=$(id -g adfmail)
# A run before this one on the same folder stops first.
for p in dovecot smtp; do
  if [ -s "$DIR/$p.pid" ]; then
    PID=$(cat "$DIR/$p.pid")
    kill "$PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  fi
done
rm -rf "$DIR"
mkdir -p "$DIR/run" "$DIR/state" "$DIR/home"
chmod 755 "$DIR"
# The CA and a server certificate for localhost and 127.0.0.1.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=adf test CA" \
  -keyout "$DIR/ca.key" -out "$DIR/ca.pem" >/dev/null 2>&1
openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$DIR/server.key" -out "$DIR/server.csr" >/dev/null 2>&1
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > "$DIR/ext.cnf"
openssl x509 -req -in "$DIR/server.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca.key" -CAcreateserial -days 2 \
  -extfile "$DIR/ext.cnf" -out "$DIR/server.crt" >/dev/null 2>&1
chmod 644 "$DIR/server.key"
: > "$DIR/users"
for u in ann bob cy dee; do
  mkdir -p "$DIR/home/$u"
  echo "$u@adf.test:{PLAIN}pw-$u:$MUID:$MGID::$DIR/home/$u" >> "$DIR/users"
done
chown -R adfmail:adfmail "$DIR/home"
cat > "$DIR/dovecot.conf" <<CONF
protocols = imap
listen = 127.0.0.1
base_dir = $DIR/run
state_dir = $DIR/state
log_path = $DIR/dovecot.log
ssl = yes
ssl_cert = <$DIR/server.crt
ssl_key = <$DIR/server.key
ssl_min_protocol = TLSv1.2
disable_plaintext_auth = yes
auth_mechanisms = plain login
first_valid_uid = $MUID
mail_location = maildir:~/Maildir
passdb {
  driver = passwd-file
  args = scheme=PLAIN username_format=%u $DIR/users
}
userdb {
  driver = passwd-file
  args = username_format=%u $DIR/users
}
service imap-login {
  inet_listener imap {
    address = 127.0.0.1
    port = 10143
  }
  inet_listener imaps {
    address = 127.0.0.1
    port = 10993
    ssl = yes
  }
}
service auth {
  unix_listener auth-userdb {
    mode = 0666
  }
}
protocol lda {
  postmaster_address = postmaster@adf.test
}
CONF
/usr/sbin/dovecot -c "$DIR/dovecot.conf"
"$VENV/bin/python" "$(dirname "$0")/../tests/peers/smtp_server.py" "$DIR" > "$DIR/smtp.log" 2>&1 &
echo $! > "$DIR/smtp.pid"
for _ in $(seq 1 100); do
  [ -f "$DIR/smtp.ready" ] && [ -s "$DIR/run/master.pid" ] && break
  sleep 0.1
done
cp "$DIR/run/master.pid" "$DIR/dovecot.pid"
echo "$DIR/ca.pem"
