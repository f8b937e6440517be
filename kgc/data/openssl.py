"""OpenSSL's ``enc`` file format, decrypted in Python (no openssl binary needed).

``openssl enc -aes-256-cbc -a -salt -pbkdf2 -pass pass:P`` writes base64 (``-a``) of
``b"Salted__" + salt (8 bytes) + AES-256-CBC(PKCS#7-padded plaintext)``, with key and IV derived as
PBKDF2-HMAC-SHA256(P, salt, 10000 iterations, 48 bytes) → key = first 32 bytes, IV = last 16 (OpenSSL's
``-pbkdf2`` defaults). The C-STS authors ship their data this way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from kgc.errors import KGCError

MAGIC = b"Salted__"


def decrypt(data: bytes, password: str, *, base64_armour: bool = True, iterations: int = 10000,
            what: str = "the file") -> bytes:
    """Plaintext of an ``openssl enc -aes-256-cbc [-a] -salt -pbkdf2`` file; a wrong password is an error."""
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if base64_armour:
        try:
            data = base64.b64decode(b"".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            raise KGCError(f"{what}: not base64 (expected `openssl enc -a` output)") from None
    if not data.startswith(MAGIC) or len(data) < 32 or (len(data) - 16) % 16:
        raise KGCError(f"{what}: not an OpenSSL salted file (no 'Salted__' header or a truncated body)")
    salt, body = data[8:16], data[16:]
    derived = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations, dklen=48)
    decryptor = Cipher(algorithms.AES(derived[:32]), modes.CBC(derived[32:])).decryptor()
    padded = decryptor.update(body) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(padded) + unpadder.finalize()
    except ValueError:
        raise KGCError(f"{what}: decryption failed: wrong password (or not aes-256-cbc with -pbkdf2)") from None
