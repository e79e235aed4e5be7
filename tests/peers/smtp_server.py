"""SMTP for tests/email.rs (.ci/mail.sh starts it): STARTTLS on 10587 and TLS
on 10465, AUTH PLAIN/LOGIN against the Dovecot users file (never without
TLS), each recipient delivered by dovecot-lda to its Maildir."""
import asyncio
import os
import ssl
import subprocess
import sys

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

DIR = sys.argv[1]
USERS = {}
for line in open(os.path.join(DIR, "users")):
    name, pw = line.split(":")[:2]
    USERS[name] = pw.removeprefix("{PLAIN}")


def auth(server, session, envelope, mechanism, data):
    ok = isinstance(data, LoginPassword) and USERS.get(data.login.decode()) == data.password.decode()
    return AuthResult(success=ok)


class Deliver:
    async def handle_RCPT(self, server, session, envelope, address, options):
        if address.lower() not in USERS:
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        if not session.authenticated:
            return "530 5.7.0 authentication required"
        for rcpt in envelope.rcpt_tos:
            p = subprocess.run(
                ["/usr/lib/dovecot/dovecot-lda", "-c", os.path.join(DIR, "dovecot.conf"),
                 "-d", rcpt.lower(), "-f", envelope.mail_from],
                input=envelope.original_content,
            )
            if p.returncode != 0:
                return "451 4.3.0 delivery failed"
        return "250 OK delivered"


ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(os.path.join(DIR, "server.crt"), os.path.join(DIR, "server.key"))
common = dict(hostname="127.0.0.1", authenticator=auth, data_size_limit=60 * 1024 * 1024)
# STARTTLS is required before AUTH there; the other port is TLS from the start.
starttls = Controller(Deliver(), port=10587, tls_context=ctx, require_starttls=True, auth_require_tls=True, **common)
implicit = Controller(Deliver(), port=10465, ssl_context=ctx, auth_require_tls=False, **common)
starttls.start()
implicit.start()
open(os.path.join(DIR, "smtp.ready"), "w").close()
try:
    asyncio.new_event_loop().run_forever()
except KeyboardInterrupt:
    pass
