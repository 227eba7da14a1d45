# Every key of the CLI's configuration schema, with a value of the right type. The module
# checks write it through the NixOS and home-manager modules and read it back; the
# vm-tool-paths test installs it (without backends.nono.path, which would override the
# package's nono).
{
  backend = "native";
  additional_folders = [ "/srv/cache" ];
  read_folders = [ "/srv/datasets" "~/datasets" ];
  network = {
    block = true;
    allow_ports = [ 3000 ];
    allow_domains = [ "example.com" ];
  };
  env = {
    pass = [ "CARGO_HOME" ];
    set = { FOO = "bar"; };
  };
  timeout = "30m";
  views = { root = "/var/lib/sandbox-views"; };
  service = { hook_port = 7465; idle_exit = "10m"; };
  backends = {
    native = { allow_unix_sockets = false; };
    custom = { command = "/usr/local/bin/launcher --flag"; };
    nono = { path = "/run/current-system/sw/bin/nono"; };
  };
}
