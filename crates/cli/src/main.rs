fn main() {
    println!("picnic");
}
