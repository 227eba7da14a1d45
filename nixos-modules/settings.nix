# The typed `programs.sandbox.settings` option, generated from the CLI's own schema:
# crates/sandbox-cli/schema/config-schema.json is `sandbox config schema` (a cargo test keeps
# it equal), so the module accepts what the CLI accepts and documents each key with the CLI's
# own words. Every key is nullable, as in the CLI, and null means "not set": `prune` drops
# nulls (and sections left empty) before the file is written.
#
# Only the JSON Schema the CLI emits is understood (objects, arrays, strings with an
# optional pattern, booleans, bounded integers, `$ref`, nullable unions); anything else
# throws, so a new kind of field cannot slip through untyped.
{ lib }:
let
  inherit (lib) types;

  schema = lib.importJSON ../crates/sandbox-cli/schema/config-schema.json;

  deref = s:
    if s ? "$ref" then schema."$defs".${lib.removePrefix "#/$defs/" s."$ref"} // lib.removeAttrs s [ "$ref" ]
    else s;

  # The schema of `s` without its `null` alternative.
  nonNull = s:
    let s' = deref s; in
    if s' ? anyOf then
      let alternatives = lib.filter (a: (a.type or null) != "null") s'.anyOf; in
      if lib.length alternatives == 1 then nonNull (lib.head alternatives // lib.removeAttrs s' [ "anyOf" ])
      else throw "settings.nix: unsupported schema union: ${builtins.toJSON s'}"
    else if lib.isList (s'.type or null) then
      let kinds = lib.remove "null" s'.type; in
      if lib.length kinds == 1 then s' // { type = lib.head kinds; }
      else throw "settings.nix: unsupported schema type list: ${builtins.toJSON s'.type}"
    else s';

  describe = s: (deref s).description or "";

  typeOf = path: s:
    let s' = nonNull s; in
    if s'.type == "boolean" then types.bool
    else if s'.type == "integer" then types.ints.between s'.minimum s'.maximum
    else if s'.type == "string" then
      (if s' ? pattern then types.strMatching s'.pattern else types.str)
      // lib.optionalAttrs (s' ? pattern) { description = "string (${s'.description or s'.pattern})"; }
    else if s'.type == "array" then types.listOf (typeOf path s'.items)
    else if s'.type == "object" && s' ? properties then
      types.submodule { options = optionsOf path s'; }
    else if s'.type == "object" && s' ? additionalProperties && lib.isAttrs s'.additionalProperties then
      let
        value = typeOf path s'.additionalProperties;
        namePattern = s'.propertyNames.pattern or null;
        nameOk = name: namePattern == null || builtins.match namePattern name != null;
      in
      (types.addCheck (types.attrsOf value) (v: lib.all nameOk (lib.attrNames v)))
      // { description = "attribute set of (${value.description})" + lib.optionalString (namePattern != null) ", names matching `${namePattern}`"; }
    # A free-form mapping (an agent's own settings, passed through as JSON).
    else if s'.type == "object" && (s'.additionalProperties or true) == true then
      types.attrsOf types.anything // { description = "attribute set of JSON values"; }
    else throw "settings.nix: ${lib.concatStringsSep "." path}: unsupported schema ${builtins.toJSON s'}";

  optionsOf = path: s:
    lib.mapAttrs
      (name: property: lib.mkOption {
        type = types.nullOr (typeOf (path ++ [ name ]) property);
        default = null;
        description = describe property;
      })
      s.properties;

  prune = value:
    if lib.isAttrs value then
      lib.filterAttrs (_: v: v != null && v != { }) (lib.mapAttrs (_: prune) value)
    else value;
in
{
  type = types.submodule { options = optionsOf [ ] schema; };

  # The settings the user set, as the CLI reads them: nulls and empty sections dropped.
  inherit prune;
}
