#!/usr/bin/env python3
"""Add the `quotalease` command to a built wheel, in place.

Usage: wheel-add-command.py WHEEL BINARY

The file goes to `<name>-<version>.data/scripts/quotalease`, which pip installs
into the environment's bin/ (on PATH in an activated venv), and gets its line
in the wheel's RECORD (sha256 and size), so pip verifies it like every other
file. Entries are copied unchanged; RECORD stays the last entry.
"""

import base64
import hashlib
import os
import sys
import zipfile


def main() -> None:
    wheel, binary = sys.argv[1], sys.argv[2]
    name_version = "-".join(os.path.basename(wheel).split("-")[:2])
    script = f"{name_version}.data/scripts/quotalease"
    record = f"{name_version}.dist-info/RECORD"
    with open(binary, "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    tmp = wheel + ".tmp"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        names = src.namelist()
        if script in names:
            sys.exit(f"error: {wheel} already has {script}")
        for info in src.infolist():
            if info.filename != record:
                out.writestr(info, src.read(info.filename))
        record_info = src.getinfo(record)
        lines = src.read(record).decode().splitlines()
        # The script's own entry: rwxr-xr-x, a regular file, the RECORD's time.
        info = zipfile.ZipInfo(script, date_time=record_info.date_time)
        info.external_attr = 0o100755 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        out.writestr(info, data)
        lines.insert(
            len(lines) - 1 if lines and lines[-1].startswith(record) else len(lines),
            f"{script},sha256={digest},{len(data)}",
        )
        out.writestr(record_info, "\n".join(lines) + "\n")
    os.replace(tmp, wheel)
    print(f"wheel: added {script} ({len(data)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
