# The configuration schema the `sandbox` CLI accepts (crates/sandbox-cli/src/config.rs), and a
# checker for `programs.sandbox.settings`. The CLI rejects unknown keys, so a typo here would
# otherwise surface only when a user runs `sandbox`; the modules turn it into an assertion that
# fails the system or home build instead.
#
# Pure builtins only, so the offline evaluation in tests/nix-eval can run it too.
let
  inherit (builtins) all attrNames concatMap concatStringsSep elem isAttrs isBool isInt isList isString substring typeOf;

  leaf = describe: check: { _leaf = true; inherit describe check; };

  string = leaf "a string" isString;
  bool = leaf "true or false" isBool;
  port = leaf "a TCP port (1-65535)" (v: isInt v && v >= 1 && v <= 65535);
  absPath = leaf "an absolute path as a string (\"/srv/cache\", not a Nix path, which would be copied into the store)"
    (v: isString v && substring 0 1 v == "/");
  listOf = item: leaf "a list whose items are each ${item.describe}" (v: isList v && all item.check v);
  stringMap = leaf "an attribute set of strings" (v: isAttrs v && all (k: isString v.${k}) (attrNames v));

  schema = {
    backend = string;
    additional_folders = listOf absPath;
    read_folders = listOf absPath;
    network = {
      block = bool;
      allow_ports = listOf port;
      allow_domains = listOf string;
    };
    env = {
      pass = listOf string;
      set = stringMap;
    };
    timeout = string;
    views = {
      root = absPath;
    };
    service = {
      hook_port = port;
    };
    backends = {
      native = {
        allow_unix_sockets = bool;
      };
      custom = {
        command = string;
      };
      nono = {
        path = absPath;
      };
    };
  };

  describeValue = v: if isString v then "the string \"${v}\"" else "a ${typeOf v}";

  # Every problem in `value` measured against `spec`, as messages naming the key's path.
  problems = path: spec: value:
    let
      where = if path == [ ] then "settings" else "settings.${concatStringsSep "." path}";
    in
    if spec ? _leaf then
      (if spec.check value then [ ] else [ "${where}: expected ${spec.describe}, got ${describeValue value}" ])
    else if !(isAttrs value) then
      [ "${where}: expected an attribute set, got ${describeValue value}" ]
    else
      concatMap
        (key:
          if elem key (attrNames spec) then
            problems (path ++ [ key ]) spec.${key} value.${key}
          else
            [ "${where}.${key}: unknown key (the sandbox CLI rejects it); known keys here: ${concatStringsSep ", " (attrNames spec)}" ])
        (attrNames value);
in
{
  inherit schema;

  # A list of messages; empty when the CLI will accept `settings`.
  check = settings: problems [ ] schema settings;
}
