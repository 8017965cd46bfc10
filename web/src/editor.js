// The job editor: CodeMirror 6 with the job specification's JSON schema (YAML or JSON text),
// giving completion, hover documentation and schema errors as you type. Bundled by
// scripts/build-console.sh (esbuild) into static/vendor/editor.js; console.js calls it.
import { basicSetup, EditorView } from "codemirror";
import { yamlSchema } from "codemirror-json-schema/yaml";

export function createEditor(textarea, schema) {
  const view = new EditorView({
    doc: textarea.value,
    parent: textarea.parentNode,
    extensions: [
      basicSetup,
      yamlSchema(schema),
      EditorView.lineWrapping,
      EditorView.contentAttributes.of({ "aria-label": textarea.getAttribute("aria-label") || "Job specification" }),
      EditorView.updateListener.of(function (update) {
        if (!update.docChanged) return;
        textarea.value = update.state.doc.toString();
        textarea.dispatchEvent(new Event("input", { bubbles: true }));
      }),
    ],
  });
  textarea.parentNode.insertBefore(view.dom, textarea);
  textarea.hidden = true;
  return {
    view: view,
    set: function (text) { view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } }); },
  };
}

window.ConfideEditor = { create: createEditor };
