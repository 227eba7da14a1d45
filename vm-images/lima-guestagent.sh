# Runs the lima-guestagent that the host's limactl put on the cidata disk, so the guest agent
# always matches the limactl that started the VM. It forwards ports and reports events.
cidata=/mnt/lima-cidata
agent="$cidata/lima-guestagent"

while IFS= read -r line; do
  if [ -n "$line" ]; then export "${line?}"; fi
done <"$cidata/lima.env"

args=(daemon "--debug=${LIMA_CIDATA_DEBUG:-false}")
if [ "${LIMA_CIDATA_VSOCK_PORT:-0}" != 0 ]; then
  args+=(--vsock-port "$LIMA_CIDATA_VSOCK_PORT")
fi
if [ -n "${LIMA_CIDATA_VIRTIO_PORT:-}" ]; then
  args+=(--virtio-port "$LIMA_CIDATA_VIRTIO_PORT")
fi
# Older agents do not know --socket-owner.
if "$agent" daemon --help 2>&1 | grep -q -- --socket-owner; then
  args+=(--socket-owner "$LIMA_CIDATA_UID")
fi
exec "$agent" "${args[@]}"
