# Sourced on the GPU machine from the repository root, after `make gpu-test`
# (which builds build-gpu/ and unpacks the carried packages into .deps/root):
# DeepSpeed and what it needs from .deps/py into /tmp/zinf-py, libaio for its
# async I/O op, the carried fio on PATH. `make device-debs` (here, with
# network) fetched all of it.
zinf_root=$(pwd)
mkdir -p /tmp/zinf-aio && ln -sf "$zinf_root"/.deps/root/usr/lib/x86_64-linux-gnu/libaio.so* /tmp/zinf-aio/
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/zinf-py${PYTHONPATH:+:$PYTHONPATH} PATH=$zinf_root/.deps/bin:$PATH \
  CPATH=$zinf_root/.deps/root/usr/include/libaio-only LIBRARY_PATH=/tmp/zinf-aio \
  LD_LIBRARY_PATH=/tmp/zinf-aio${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} TORCH_EXTENSIONS_DIR=/tmp/zinf-torch-ext
# Only libaio.h on the include path: the other carried headers are the build's.
mkdir -p "$CPATH" && ln -sf ../libaio.h "$CPATH"/
[ -d /tmp/zinf-py/deepspeed ] || DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps \
  --no-build-isolation --target /tmp/zinf-py "$zinf_root"/.deps/py/*
