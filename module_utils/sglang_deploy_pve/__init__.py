"""The Proxmox layer, control-node code: the API client, the VM's spec and configuration, the plan of a
change and the guest's SSH host keys. Only modules that run on the control node (delegated to localhost)
import it; nothing here reaches a managed host. STDLIB ONLY at import time, as the host package."""
